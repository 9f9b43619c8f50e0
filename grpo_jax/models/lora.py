"""Low-rank adapters (LoRA, Hu et al. 2021) on the decoder's linear projections.

For a projection y = x W (W: in dims..., out dims...), an adapter adds

    y = x W + s * (x A) B,    A: (in dims..., r),  B: (r, out dims...),  s = alpha / r

(alpha / sqrt(r) with use_rslora). A starts as PEFT's and loralib's default, uniform on
[-1/sqrt(fan_in), 1/sqrt(fan_in)] (kaiming-uniform with a = sqrt(5)), and B as zeros, so step 0
is the base model exactly. The adapters are a plain pytree shaped like the params they adapt:

    {"layers": {"self_attn": {"q_proj": {"lora_a": (L, E, r), "lora_b": (L, r, H, D)}, ...},
                "mlp": {"down_proj": {...}, ...}}}          (stacked on the layer axis)

Their logical axes (`adapter_axes`) are the adapted kernel's: A keeps the kernel's input axes,
B its output axes, and the rank axis ("lora") is replicated.

`LoraParams(base, adapters)` is what the decoder's forward takes in place of plain params under
LoRA (grpo_jax/models/decoder.py `decoder_apply`); the base alone is the same model with the
adapters off (the KL reference). The forward never builds W + s A B: the adapter path is two
thin matmuls beside the base one. `merge` builds it once, for export.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

# The projections an adapter may sit on (PEFT's target_modules names), and where they live.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
           "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


class LoraParams(flax.struct.PyTreeNode):
  """The policy under LoRA: frozen base params and trainable adapters (see module docstring)."""
  base: Any
  adapters: Any


def base_params(params):
  """The base params of plain params (themselves) or of LoraParams."""
  return params.base if isinstance(params, LoraParams) else params


def input_dims(name: str) -> int:
  """How many leading dims of a projection's kernel are its input: o_proj's (heads, head_dim,
  embed) reads two; q/k/v's (embed, heads, head_dim) and the 2-d kernels one."""
  return 2 if name == "o_proj" else 1


def lora_scale(rank: int, alpha: float, use_rslora: bool = False) -> float:
  """s = alpha / r (PEFT's scaling), or alpha / sqrt(r) with rsLoRA."""
  return float(alpha) / (math.sqrt(rank) if use_rslora else rank)


def parse_targets(targets: str) -> tuple:
  """"q_proj,v_proj" -> ("q_proj", "v_proj"); "all-linear" -> every projection (PEFT's name).
  Raises ValueError naming an unknown module."""
  names = [t.strip() for t in str(targets).split(",") if t.strip()]
  if names == ["all-linear"]:
    return TARGETS
  unknown = [n for n in names if n not in TARGETS]
  if unknown or not names:
    what = f"unknown module {', '.join(unknown)}" if unknown else "no module named"
    raise ValueError(f"lora.targets={targets!r}: {what}; use comma-separated names from "
                     f"{', '.join(TARGETS)}, or 'all-linear'.")
  return tuple(n for n in TARGETS if n in names)


def init_adapters(base, targets, rank: int, key, dtype=jnp.float32):
  """Adapters (A uniform, B zero; see module docstring) for every `targets` projection of every
  layer of `base`, in float32 by default. Layer l's A of projection p is drawn from
  fold_in(fold_in(key, l), index of p in TARGETS), so the values do not depend on which other
  projections are targets."""
  num_layers = jax.tree.leaves(base["layers"])[0].shape[0]
  first = jax.tree.map(lambda x: x[0], base["layers"])  # one layer's shapes

  def one_layer(index):
    entry = {}
    for name in targets:
      if name not in first[_PARENT[name]]:  # a mixture's MLP (models/moe.py): no adapters
        continue
      shape = first[_PARENT[name]][name]["kernel"].shape
      k_in = input_dims(name)
      bound = 1.0 / math.sqrt(math.prod(shape[:k_in]))
      a = jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, index), TARGETS.index(name)),
                             shape[:k_in] + (rank,), dtype, -bound, bound)
      b = jnp.zeros((rank,) + shape[k_in:], dtype)
      entry.setdefault(_PARENT[name], {})[name] = {"lora_a": a, "lora_b": b}
    return entry

  layers = [one_layer(i) for i in range(num_layers)]
  return {"layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def adapter_axes(kernel_axes: dict) -> dict:
  """{("layers", parent, name, "lora_a" / "lora_b"): logical axes} from the decoder's declared
  {path: axes} of the kernels an adapter may sit on: A (layers, in axes..., "lora"),
  B (layers, "lora", out axes...)."""
  out = {}
  for name in TARGETS:
    path = ("layers", _PARENT[name], name)
    layer, *axes = kernel_axes[path + ("kernel",)]
    k_in = input_dims(name)
    out[path + ("lora_a",)] = (layer, *axes[:k_in], "lora")
    out[path + ("lora_b",)] = (layer, "lora", *axes[k_in:])
  return out


def adapter_delta(x: jax.Array, adapter, scale: float, name: str, dtype) -> jax.Array:
  """s * (x A) B for one projection: x (..., in dims) -> (..., out dims), in `dtype`."""
  k_in = input_dims(name)
  a, b = adapter["lora_a"].astype(dtype), adapter["lora_b"].astype(dtype)
  low = jnp.tensordot(x.astype(dtype), a, axes=k_in)  # (..., r)
  return jnp.tensordot(low, b, axes=1) * jnp.asarray(scale, dtype)


def adapted(module_out: jax.Array, x: jax.Array, adapters, name: str, scale: float, dtype):
  """A projection's output plus its adapter's delta when `adapters` (the enclosing module's
  entry) has one; the output unchanged otherwise (adapters off)."""
  if adapters is None or name not in adapters:
    return module_out
  return module_out + adapter_delta(x, adapters[name], scale, name, dtype).astype(
      module_out.dtype)


def merge(base, adapters, scale: float):
  """base with W <- W + s * A B on every adapted kernel (float32 arithmetic, base dtype kept):
  the full weights of the adapted model, for export."""
  out = jax.tree.map(lambda x: x, base)  # a copy of the dict structure (leaves shared)
  for parent, projections in adapters["layers"].items():
    for name, ad in projections.items():
      kernel = base["layers"][parent][name]["kernel"]
      a, b = ad["lora_a"].astype(jnp.float32), ad["lora_b"].astype(jnp.float32)
      delta = jax.vmap(lambda a_, b_: jnp.tensordot(a_, b_, axes=1))(a, b)  # (L, in..., out...)
      merged = kernel.astype(jnp.float32) + scale * delta
      out["layers"][parent][name] = {**out["layers"][parent][name],
                                     "kernel": merged.astype(kernel.dtype)}
  return out


def count(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))
