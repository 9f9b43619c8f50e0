"""The device mesh and the one table that maps logical axis names to mesh axes (MaxText style).

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism whose params, optimizer
state and reference are sharded too), `tensor` (heads and MLP columns split across devices),
`expert` (a mixture's experts split across devices, models/moe.py; like MaxText's, its devices
also take distinct rows, so that attention and the dense parts are data-parallel over it),
`context` (each row's tokens split across devices in the teacher-forced passes and the
prefill: context parallelism, models/context.py; decode splits rows over it instead).
Every other module names logical axes only; `LOGICAL_RULES` decides where they go.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import ml_collections
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor", "expert", "context")

# logical axis -> mesh axis (or axes); None = replicated.
LOGICAL_RULES = {
    "batch": ("data", "fsdp", "expert"),  # rows of prompts / completions / KV cache
    "vocab": "tensor",
    # the model dimension of weights: FSDP shards it, and so does context (as MaxText's rules:
    # the devices that split a row's tokens hold a share of the weights too)
    "embed": ("fsdp", "context"),
    "heads": "tensor",  # attention heads (a dim of their own: a head is never split)
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "value": None,
    "lora": None,  # the adapters' rank
    "layers": None,  # the stacked layers' leading axis (scanned over, never split)
    "expert": "expert",  # a mixture's experts (models/moe.py)
    "length": "context",  # an activation's token axis (context parallelism)
    # embeddings.lookup's layouts: the rows over the batch axes that do not split `embed`, and
    # `embed` over its axes that do not split the rows
    "batch_beside_embed": ("data", "expert"),
    "embed_beside_batch": "context",
}


# The sampler's decode loops do not split a row's tokens: there the `context` devices take
# distinct rows, as `data`'s do (`sampler_rules`); its prefill splits them (`prefill_rules`).
# Its weights are gathered over data x fsdp x context once per call (rollout/engine.read_params;
# `tensor` and `expert` keep their split): left sharded, XLA gathered each layer's weights
# again for the prefill and for the decode loop and kept every copy (docs/meshes.md).
_SAMPLER_ROWS = ("data", "fsdp", "expert", "context")
SAMPLER_RULES = {**LOGICAL_RULES, "batch": _SAMPLER_ROWS, "length": None, "embed": None,
                 "batch_beside_embed": _SAMPLER_ROWS, "embed_beside_batch": None}
_RULES = contextvars.ContextVar("grpo_jax_mesh_rules", default=LOGICAL_RULES)


@contextlib.contextmanager
def _rules(table: dict):
  """Inside: `table` is the rules table that spec_for, constrain and context_size read."""
  token = _RULES.set(table)
  try:
    yield
  finally:
    _RULES.reset(token)


def sampler_rules():
  """Inside: SAMPLER_RULES instead of LOGICAL_RULES (the sampler's programs trace under it)."""
  return _rules(SAMPLER_RULES)


def prefill_rules(length: int):
  """Inside a sampler's program, the rules of its prefill over `length` prompt tokens: a row's
  tokens split over `context` (LOGICAL_RULES) when they divide by it, as the teacher-forced
  passes split them; else the surrounding rules. The cache the prefill writes is then laid
  out by the sampler's rules again (rollout/prefill.constrain_cache), rows over `context`, for
  decode: XLA moves each row's keys and values to its row's device once."""
  context = _mesh_context()
  split = context > 1 and length % context == 0
  return _rules(LOGICAL_RULES) if split else contextlib.nullcontext()


_NAMES = "(" + ", ".join(MESH_AXES) + ")"


def mesh_config(*sizes) -> ml_collections.ConfigDict:
  """The mesh section for (data, fsdp, tensor[, expert[, context]]) sizes (the axes not
  given: 1)."""
  sizes = tuple(sizes) + (1,) * (len(MESH_AXES) - len(sizes))
  return ml_collections.ConfigDict(dict(zip(MESH_AXES, sizes)))


def resolve_mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, ...]:
  """Sizes of (data, fsdp, tensor, expert, context); one of them may be -1 for "the rest of
  the devices". An axis the section does not name is 1."""
  sizes = [int(mesh_cfg.get(axis, 1)) for axis in MESH_AXES]
  wildcards = [i for i, s in enumerate(sizes) if s == -1]
  if len(wildcards) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh {_NAMES} = {tuple(sizes)}: use positive sizes with at "
                     f"most one -1 (the rest of the devices).")
  known = math.prod(s for s in sizes if s != -1)
  if wildcards:
    if num_devices % known:
      raise ValueError(f"mesh {_NAMES} = {tuple(sizes)} cannot fill {num_devices} "
                       f"devices: {num_devices} is not a multiple of {known}.")
    sizes[wildcards[0]] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"mesh {_NAMES} = {tuple(sizes)} has {math.prod(sizes)} "
                     f"devices but {num_devices} are present; make the product {num_devices} "
                     f"(or set one axis to -1).")
  return tuple(sizes)


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(mesh_cfg, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def role_meshes(mesh_cfg, rollout_devices: int = 0, devices=None) -> tuple[Mesh, Mesh | None]:
  """(learner's mesh, sampler's mesh or None) carved from `devices` (default jax.devices(), the
  same global order on every process): rollout_devices = 0 gives one mesh of them all, shared
  (None for the sampler's); n > 0 gives the first (total - n) devices to the learner and the
  last n to the sampler, each laid out by `mesh_cfg` (its -1 axis takes the rest of that
  role's devices). Raises ValueError naming the numbers when the split or a mesh cannot be."""
  devices = list(jax.devices() if devices is None else devices)
  n, total = int(rollout_devices), len(devices)
  if n == 0:
    return make_mesh(mesh_cfg, devices), None
  if not 0 < n < total:  # one device has no range to offer
    share = (f"or 1 to {total - 1} (the sampler's share)" if total > 1 else
             "(split placement needs at least 2 devices: one for the learner, one for the "
             "sampler)")
    raise ValueError(f"mesh.rollout_devices={n} cannot be carved from {total} "
                     f"device{'s' if total != 1 else ''}; use 0 (one shared mesh) {share}.")
  meshes = []
  for role, part in (("learner", devices[:total - n]), ("sampler", devices[total - n:])):
    try:
      meshes.append(make_mesh(mesh_cfg, part))
    except ValueError as e:
      raise ValueError(f"mesh.rollout_devices={n} gives the {role} {len(part)} devices, and "
                       f"its {e}") from None
  return meshes[0], meshes[1]


def batch_axis_size(mesh: Mesh) -> int:
  """The devices a batch's rows split over: data x fsdp x expert."""
  return math.prod(mesh.shape[a] for a in LOGICAL_RULES["batch"])


def _mesh_context() -> int:
  """The size of the surrounding `jax.set_mesh`'s `context` axis (1 without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty or "context" not in mesh.axis_names else mesh.shape["context"]


def context_size() -> int:
  """The devices a row's tokens split over: the `context` axis of the surrounding
  `jax.set_mesh` (1 without one, and under `sampler_rules`)."""
  return 1 if _RULES.get() is SAMPLER_RULES else _mesh_context()


def spec_for(logical: tuple, shape: tuple, mesh: Mesh) -> PartitionSpec:
  """PartitionSpec of an array whose dims carry `logical` names; a dim that does not divide
  by its mesh axes stays replicated (so every model shape runs on every mesh)."""
  parts, rules = [], _RULES.get()
  for name, dim in zip(logical, shape):
    axes = rules.get(name) if name else None
    if axes is not None:
      axes_t = axes if isinstance(axes, tuple) else (axes,)
      if dim % math.prod(mesh.shape[a] for a in axes_t):
        axes = None
    parts.append(axes)
  return PartitionSpec(*parts)


def constrain(x: jax.Array, logical: tuple) -> jax.Array:
  """An activation laid out by the rules from its logical axis names (MaxText's
  `nn.with_logical_constraint`), under the mesh of the surrounding `jax.set_mesh` (the training
  loop sets the run's); without one (a single device, the seeds axis) it is x unchanged."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
    return x
  return jax.lax.with_sharding_constraint(x, spec_for(logical, x.shape, mesh))


def _path_keys(path) -> tuple:
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def place_tree(tree, mesh: Mesh, axes_of):
  """Puts a params-like pytree (host or device arrays, identical on every process) on the mesh
  by the rules (`axes_of` as in tree_shardings)."""
  def place(x, sharding):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.wrap_key_data(place(jax.random.key_data(x), sharding),
                                      impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and x.is_fully_addressable and jax.process_count() == 1:
      return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
  return jax.tree.map(place, tree, tree_shardings(tree, mesh, axes_of))


def split_heads_note(model_cfg, mesh) -> str | None:
  """One line when the tensor axis does not divide a head count (those projections are then
  replicated, never split inside a head); None when every head stays whole on one device."""
  tensor = mesh.shape["tensor"]
  bad = sorted({n for n in (model_cfg.num_heads, model_cfg.num_kv_heads) if n % tensor})
  if tensor == 1 or not bad:
    return None
  return (f"warning: mesh tensor={tensor} does not divide the model's head counts "
          f"(num_heads={model_cfg.num_heads}, num_kv_heads={model_cfg.num_kv_heads}); the "
          f"projections of {bad} heads are replicated over tensor instead of splitting a head.")


def tree_shardings(tree, mesh: Mesh, axes_of):
  """NamedShardings for a params-like pytree (optimizer states included): `axes_of(path,
  ndim)` gives a leaf's logical axes from its path (a tuple of key names; the model declares
  them, grpo_jax/models/partitioning.py), which the rules map to mesh axes. The attention
  kernels carry their heads as a dimension of its own, so tensor splits whole heads, or (when
  it does not divide the head count) none: a head is never split across devices."""
  def one(path, leaf):
    shape = np.shape(leaf)
    return NamedSharding(mesh, spec_for(axes_of(_path_keys(path), len(shape)), shape, mesh))
  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Leading dim over the batch axes (data, fsdp, expert), the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(LOGICAL_RULES["batch"], *([None] * (ndim - 1))))


def shard_batch(tree, mesh: Mesh, replicate_indivisible: bool = False):
  """Places every array of a batch pytree with its leading dim split over the batch axes.

  A leading dim that does not divide by them is an error, or with replicate_indivisible
  (prompts, which the sampler repeats G times and then splits) placed whole on every device.
  """
  size = batch_axis_size(mesh)

  def place(x):
    x = x if isinstance(x, jax.Array) else np.asarray(x)
    if x.ndim and x.shape[0] % size and not replicate_indivisible:
      raise ValueError(f"a batch of {x.shape[0]} rows does not split over the {size} devices "
                       f"of the mesh's data x fsdp x expert axes ({mesh.shape['data']} x "
                       f"{mesh.shape['fsdp']} x {mesh.shape['expert']}); make the batch a "
                       f"multiple of {size}.")
    if x.ndim and not x.shape[0] % size:
      sharding = batch_sharding(mesh, x.ndim)
    else:  # a scalar, or indivisible prompts placed whole
      sharding = NamedSharding(mesh, PartitionSpec())
    if isinstance(x, np.ndarray):
      # Every process holds the same global host array and contributes its own shards.
      return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
    return jax.device_put(x, sharding)
  return jax.tree.map(place, tree)


def bytes_per_device(tree) -> int:
  """Bytes of `tree` held by the most loaded device."""
  per_device = {}
  for leaf in jax.tree.leaves(tree):
    if not isinstance(leaf, jax.Array):
      continue
    for shard in leaf.addressable_shards:
      per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
  return max(per_device.values()) if per_device else 0
