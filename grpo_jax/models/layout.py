"""The params' one in-memory layout and the per-layer views taken of it.

The decoder's layers are stacked on a leading layer axis (``{"layers": {...}}``, each leaf
(L, ...)). Two per-layer views exist, both derived from the stack and never stored:

* a tuple of per-layer trees (`split_layers`, `per_layer`): the sampler's forwards with a KV
  cache run the layers unrolled, each on its slice (grpo_jax/models/decoder.py);
* ``layers_0`` ... ``layers_{L-1}`` entries (`unstack_layers`, `stack_layers`): the layout of
  checkpoints written before the stacked layout became the only one, of random init (drawn one
  module per layer so that a seed keeps its model) and of per-layer references in tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.models.lora import LoraParams


def per_layer(layers, num_layers: int) -> tuple:
  """The stacked layers' params (or adapters) as one tree per layer; already split ones (a
  tuple, `split_layers`) as they are."""
  if isinstance(layers, (tuple, list)):
    return tuple(layers)
  return tuple(jax.tree.map(lambda a, i=i: a[i], layers) for i in range(num_layers))


def split_layers(params, num_layers: int):
  """Params (or LoraParams) with the layer stack split into a tuple of per-layer trees, for the
  sampler's forwards with a cache (see Decoder): sliced once before a decode loop, not once per
  step."""
  split = lambda tree: {**tree, "layers": per_layer(tree["layers"], num_layers)}  # noqa
  if isinstance(params, LoraParams):
    return LoraParams(split(params.base), split(params.adapters))
  return split(params)


def compute_copy(params, dtype):
  """The params with every floating matrix (ndim >= 2) in the compute `dtype`, the values each
  layer casts it to at every use (flax promotes kernels, biases and embeddings to the module's
  dtype), so nothing computed changes; vectors (norm scales) keep theirs. The sampler takes
  this copy once per call: with float32 master weights and bfloat16 compute, a decode step
  then reads half the weight bytes and casts nothing. LoraParams and a tree already in
  `dtype` are returned as they are."""
  dtype = jnp.dtype(dtype)
  if isinstance(params, LoraParams):
    return params
  cast = lambda x: (x.astype(dtype) if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating)  # noqa: E731
                    and jnp.finfo(x.dtype).bits > jnp.finfo(dtype).bits else x)
  return jax.tree.map(cast, params)


def stack_layers(params, num_layers: int):
  """Per-layer params {"layers_0": ..., "layers_{L-1}": ...} -> {"layers": stacked on a
  leading axis}; the other entries are kept."""
  out = {k: v for k, v in params.items() if not k.startswith("layers_")}
  out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs),
                               *[params[f"layers_{i}"] for i in range(num_layers)])
  return out


def unstack_layers(params, num_layers: int, one_layer=None):
  """Inverse of stack_layers. one_layer(leaf, i) takes layer i of a stacked leaf (default:
  ``leaf[i]``; abstract trees pass their own)."""
  take = one_layer or (lambda x, i: x[i])
  out = {k: v for k, v in params.items() if k != "layers"}
  for i in range(num_layers):
    out[f"layers_{i}"] = jax.tree.map(lambda x, i=i: take(x, i), params["layers"])
  return out
