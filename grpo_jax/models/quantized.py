"""Quantised rollout weights (rollout.weight_dtype): the sampler reads an int8 (or fp8) copy of
the decoder layers' kernels, made by qwix (Google's JAX quantisation library) from the policy
after each update; training keeps full precision.

Weight-only quantisation: each kernel of the layer stack (the attention and MLP projections,
a mixture's experts; not its router) becomes a `qwix.QArray`, absmax-scaled per output channel, i.e.
one scale for every index of the kernel's non-contracted axes (layer, expert, heads, head_dim
or the output width). The embedding, the vocabulary projection and the norms stay as they are.
The sampler's per-layer forwards dequantise one layer's kernels to the compute dtype right
before using them (models/decoder.py), so the full-precision copy of all layers never exists
at once. The sampler's log-probs are those of the quantised policy: the difference from the
trained one shows in `sampler_logprob_gap` and `rollout_kl`, and rl.tis_cap corrects it.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp

from grpo_jax.models.lora import LoraParams, input_dims

# rollout.weight_dtype -> the qwix qtype ("" or "none": full precision, no copy).
WEIGHT_DTYPES = {"int8": jnp.int8, "float8_e4m3fn": jnp.float8_e4m3fn}


def _is_qarray(x) -> bool:
  qwix = sys.modules.get("qwix")  # imported when a QArray is made (0.3 s of a run's start)
  return qwix is not None and isinstance(x, qwix.QArray)


def _quantize_kernel(name: str, kernel: jax.Array, leading: int, qtype):
  """`kernel` (L, [E,] in..., out...) with per-channel scales over every non-contracted axis,
  one layer at a time (lax.map), so that the float32 temporaries of the quantisation are one
  layer's, not the whole stack's. The contracted (input) axes, counted after the layer axis and
  a mixture's expert axis, are lora.input_dims': o_proj (heads, head_dim, embed) contracts two."""
  contracted = set(range(leading - 1, leading - 1 + input_dims(name)))
  channelwise = [a for a in range(kernel.ndim - 1) if a not in contracted]
  import qwix  # noqa: PLC0415
  return jax.lax.map(lambda layer: qwix.quantize(layer, qtype, channelwise_axes=channelwise,
                                                 scale_dtype=jnp.float32), kernel)


def quantize_layers(params, weight_dtype: str):
  """The params (or LoraParams: the frozen base; the adapters stay) with every kernel of the
  layer stack quantised to `weight_dtype` (a key of WEIGHT_DTYPES)."""
  if isinstance(params, LoraParams):
    return LoraParams(quantize_layers(params.base, weight_dtype), params.adapters)
  if weight_dtype not in WEIGHT_DTYPES:
    raise ValueError(f"rollout.weight_dtype={weight_dtype!r}; use '' (full precision) or one "
                     f"of {sorted(WEIGHT_DTYPES)}.")

  def quantize(path, value):
    *modules, leaf = (k.key for k in path)
    # (L, in..., out...): a projection's kernel; a mixture's router ("gate") stays exact
    if leaf != "kernel" or value.ndim < 3 or modules[-1] == "gate":
      return value
    leading = 2 if "experts" in modules else 1
    return _quantize_kernel(modules[-1], value, leading, WEIGHT_DTYPES[weight_dtype])

  return {**params, "layers": jax.tree_util.tree_map_with_path(quantize, params["layers"])}


def dequantized(tree, dtype, anchor):
  """(tree with each QArray replaced by its dequantised array in `dtype`, anchor). `anchor` (the
  layer's input activations) goes through one optimization barrier with the quantised values,
  so that the dequantisation runs where the layer runs: inside a decode loop, XLA would
  otherwise hoist it out of the loop (loop-invariant), materialising every layer's full-
  precision kernels for the whole loop (measured: the same temp bytes and tokens/s as
  full precision). A tree without QArrays comes back as it is."""
  if not any(_is_qarray(x) for x in jax.tree.leaves(tree, is_leaf=_is_qarray)):
    return tree, anchor
  tree, anchor = jax.lax.optimization_barrier((tree, anchor))
  # The barrier stops the hoisting but is gone by the time XLA schedules: a data dependence on
  # the layer's input (0 x one activation, which XLA does not fold for floats) keeps each
  # layer's dequantisation after the layer before it, so one layer's kernels are live at once.
  after = 0.0 * anchor.reshape(-1)[0].astype(jnp.float32)

  import qwix  # noqa: PLC0415

  def one(x):
    if not _is_qarray(x):
      return x
    return qwix.dequantize(dataclasses.replace(x, scale=x.scale + after)).astype(dtype)
  return jax.tree.map(one, tree, is_leaf=_is_qarray), anchor


def weight_bytes(tree) -> int:
  """Bytes of a params tree as stored (a QArray: its int8 values and its scales)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
