"""The decoder's small building blocks (models/decoder.py): the logical-axes initialiser every
param is declared with, RMSNorm (Llama's, and Gemma's (1 + w)), the dense gated MLP (SwiGLU, or
Gemma's GeGLU) and the per-layer switch the sliding-window layers use."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.lora import adapted
from grpo_jax.parallel.mesh import constrain

normal_init = nn.initializers.normal(stddev=0.02)


def with_axes(init, *names):
  """`init` declaring its param's logical axes (parallel/mesh.py LOGICAL_RULES maps them)."""
  return nn.with_logical_partitioning(init, names)


class RMSNorm(nn.Module):
  """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32; plus_one (Gemma): times
  (1 + weight), the weight starting at 0."""
  eps: float
  param_dtype: Any = jnp.float32
  plus_one: bool = False

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.zeros_init() if self.plus_one else nn.initializers.ones
    weight = self.param("weight", with_axes(init, "norm"), (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    scale = weight.astype(jnp.float32)
    return (y * (1.0 + scale if self.plus_one else scale)).astype(x.dtype)


def norm_of(cfg: ModelConfig, name: str) -> RMSNorm:
  return RMSNorm(cfg.rms_norm_eps, cfg.param_dtype, cfg.norm_plus_one, name=name)


def select_by(flag, if_true, if_false):
  """if_true where flag (a Python bool, or a traced scalar inside the layer scan), else
  if_false, leaf by leaf."""
  if isinstance(flag, bool):
    return if_true if flag else if_false
  return jax.tree.map(lambda a, b: jnp.where(flag, a, b), if_true, if_false)


class MLP(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)); GeGLU (Gemma) with the tanh-approximated gelu."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, adapters=None):
    cfg = self.cfg
    dense = lambda n, axes, name, x_: adapted(nn.Dense(  # noqa: E731
        n, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=with_axes(normal_init, *axes), name=name)(x_), x_, adapters, name, cfg.lora_scale,
        cfg.dtype)
    act = nn.silu if cfg.mlp_activation == "silu" else lambda a: nn.gelu(a, approximate=True)
    hidden = act(dense(cfg.intermediate_size, ("embed", "mlp"), "gate_proj", x)) * dense(
        cfg.intermediate_size, ("embed", "mlp"), "up_proj", x)
    return dense(cfg.hidden_size, ("mlp", "embed"), "down_proj",
                 constrain(hidden, ("batch", None, "mlp")))
