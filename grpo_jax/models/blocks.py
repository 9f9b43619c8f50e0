"""The decoder's building blocks (models/decoder.py) and `Blocks`, Llama's way of putting them
together, which every model family's blocks start from (models/families/).

A family's `Blocks` say what differs between decoders that share the rest (attention, the KV
cache, the scan, scoring, LoRA): its norm, its MLP, the embeddings' scale, its rotary
function and how a layer's residual stream runs. The decoder asks the model's blocks (`ModelConfig.blocks`) for
each and never branches on a family. Their methods run inside the decoder's compact methods,
so the modules they create belong to the calling layer, under the names they give (which are
the param names, and Hugging Face's tensor names at the checkpoint edge)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models.attention import rotary_embedding
from grpo_jax.models.lora import adapted
from grpo_jax.parallel.mesh import constrain

normal_init = nn.initializers.normal(stddev=0.02)
gelu_tanh = functools.partial(nn.gelu, approximate=True)


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


def select_by(flag, if_true, if_false):
  """if_true where flag (a Python bool, or a traced scalar inside the layer scan), else
  if_false, leaf by leaf."""
  if isinstance(flag, bool):
    return if_true if flag else if_false
  return jax.tree.map(lambda a, b: jnp.where(flag, a, b), if_true, if_false)


class MLP(nn.Module):
  """A gated MLP: down(act(gate(x)) * up(x)); act = silu is SwiGLU, gelu_tanh GeGLU."""
  cfg: Any  # ModelConfig
  activation: Callable = nn.silu

  @nn.compact
  def __call__(self, x, adapters=None):
    cfg = self.cfg
    dense = lambda n, axes, name, x_: adapted(nn.Dense(  # noqa: E731
        n, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=with_axes(normal_init, *axes), name=name)(x_), x_, adapters, name,
        cfg.lora_scale, cfg.dtype)
    hidden = self.activation(dense(cfg.intermediate_size, ("embed", "mlp"), "gate_proj", x)) * (
        dense(cfg.intermediate_size, ("embed", "mlp"), "up_proj", x))
    return dense(cfg.hidden_size, ("mlp", "embed"), "down_proj",
                 constrain(hidden, ("batch", "length", "mlp")))


def residual_constrain(x):
  return constrain(x, ("batch", "length", None))


class Blocks:
  """Llama's blocks (Llama, Mistral, Qwen2, Qwen3): RMSNorm, a SwiGLU MLP, unscaled
  embeddings, and a pre-norm layer x + attn(norm(x)), then + mlp(norm(.)).

  A family whose blocks differ subclasses this, overrides what differs, and registers an
  instance under its name (models/families/__init__.py `register_blocks`); a model picks it
  with model.family. Instances hold no state (the decoder's modules keep them as attributes)."""

  name = "llama"
  # Whether the MLP is a router over experts (models/moe.py): the passes then record and
  # replay each token's experts (routing replay) and add the load-balancing loss.
  mixture = False

  def norm(self, cfg, name: str) -> nn.Module:
    """Every norm of the model: each layer's, the q/k norms (model.qk_norm) and the final."""
    return RMSNorm(cfg.rms_norm_eps, cfg.param_dtype, name=name)

  def mlp(self, cfg) -> Callable:
    """The layer's MLP, as (h, adapters, routes) -> h; routes: a mixture's replayed experts."""
    mlp = MLP(cfg, nn.silu, name="mlp")
    return lambda h, adapters, routes: mlp(h, adapters)

  def embed_scale(self, cfg):
    """The embeddings' factor (None: not scaled)."""
    return None

  def rotary(self, cfg, x, positions):
    """q or k (B, T, H, D) rotated at `positions` (B, T): RoPE (attention.rotary_embedding)
    with the config's rope type. A family with other position ids overrides it (Qwen2.5-VL's
    mRoPE, families/qwen2_5_vl.py)."""
    return rotary_embedding(x, positions, cfg.rope_theta, *cfg.rope_frequencies())

  def layer(self, cfg, attend: Callable, mlp: Callable) -> Callable:
    """The layer's residual stream, (x, attention's other inputs...) -> (x, layer cache), from
    attend (normed x, ...) -> (h, layer cache) and mlp (normed x) -> h."""
    attn_norm = self.norm(cfg, "input_layernorm")
    mlp_norm = self.norm(cfg, "post_attention_layernorm")

    def stream(x, *attention_inputs):
      h, layer_cache = attend(attn_norm(x), *attention_inputs)
      x = residual_constrain(x + h)
      return residual_constrain(x + mlp(mlp_norm(x))), layer_cache
    return stream

  def every_param(self) -> dict:
    """ModelConfig fields that turn on every optional param of this family (the axes table,
    models/partitioning.py, reads the params' declared axes from such a model)."""
    return {}

  def per_expert(self, path: tuple) -> bool:
    """Whether Hugging Face stores the param at `path` as one tensor per entry of its leading
    (expert) axis (models/hf_names.py)."""
    return False

  def export_model_type(self, cfg) -> str:
    """The model_type a random model of this family is exported as."""
    return "qwen3" if cfg.qk_norm else ("qwen2" if cfg.qkv_bias else "llama")

  def __repr__(self):
    return f"{type(self).__name__}({self.name!r})"
