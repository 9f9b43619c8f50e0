"""What the abstract-shape benchmarks (scale.py, scale_vlm.py, accelerator_parts.py) share: the
FLOPs of a compiled program, concrete values for abstract shapes, and shardings put on an
abstract tree. jax is imported inside each function: scale.py sets XLA_FLAGS (the fake device
count) before jax loads."""


def cost_flops(compiled) -> float:
  """cost_analysis()'s flops: a dict in recent jax, a list of dicts (one per module) before."""
  cost = compiled.cost_analysis()
  if cost is None:
    return float("nan")
  if isinstance(cost, dict):
    cost = [cost]
  return float(sum(c.get("flops", 0.0) for c in cost if c))


def concrete(abstract):
  """Arrays of the abstract tree's shapes (tokens 5, masks True, floats 0.01, keys of seed 0):
  values for timing, where only the shapes matter."""
  import jax
  import jax.numpy as jnp
  def fill(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jnp.broadcast_to(jax.random.key(0), x.shape)
    if x.dtype == jnp.bool_:
      return jnp.ones(x.shape, bool)
    return jnp.full(x.shape, 5 if jnp.issubdtype(x.dtype, jnp.integer) else 0.01, x.dtype)
  return jax.tree.map(fill, abstract)


def with_shardings(abstract, shardings):
  """The abstract tree with each leaf's sharding set (ShapeDtypeStructs)."""
  import jax
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract, shardings)
