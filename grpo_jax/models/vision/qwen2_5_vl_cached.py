"""Qwen2.5-VL's text decoder with a KV cache (issue 57): the prefill and decode forwards of the
VLM sampler (rollout/vlm_sampler.py), the same layers and params as
qwen2_5_vl_model.decoder_logits.

    logits, cache = cached_decoder(text_params, x, positions, kv_mask, cache, offset, cfg)

x (B, T, E) are the input embeddings (the prompt's with the image features merged in, or a
decode step's token embeddings); positions (3, B, T) their mRoPE ids; the T new keys and values
are written at cache slots [offset, offset + T) and query i (slot offset + i) attends to slot
s iff s <= offset + i and kv_mask[b, s] (attention.attention_mask). Per layer: the family's
residual stream (blocks.Blocks.layer) around grouped-query attention whose q and k are rotated
by mRoPE (mrope.apply_multimodal_rotary_pos_emb), the keys cached as the text sampler caches
them (kv_cache.py: "kt" (B, kv_heads, head_dim, S) transposed, "v" (B, kv_heads, S, head_dim)),
here stacked over the layers (leading axis L) so that one `lax.scan` runs them, as
decoder_logits does.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models.attention import attention_mask as causal_mask, grouped_query_attention
from grpo_jax.models.blocks import normal_init, with_axes
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.kv_cache import init_cache, write_cache
from grpo_jax.models.vision.mrope import apply_multimodal_rotary_pos_emb
from grpo_jax.models.vision.qwen2_5_vl_model import (VlmConfig, _FinalNorm, project_vocab,
                                                     rope_inverse_frequencies)


class CachedMropeAttention(nn.Module):
  """qwen2_5_vl_model.MropeAttention (same param names) reading and writing a KV cache:
  (x (B, T, E), positions (3, B, T), mask (B, T, S), layer cache, offset) -> (out, cache)."""
  cfg: ModelConfig
  mrope_section: tuple

  @nn.compact
  def __call__(self, x, positions, mask, layer_cache, offset):
    cfg = self.cfg
    heads = lambda n, axis, name: nn.DenseGeneral(  # noqa: E731
        (n, cfg.head_dim), use_bias=cfg.qkv_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=with_axes(normal_init, "embed", axis, "head_dim"),
        bias_init=with_axes(nn.initializers.zeros_init(), axis, "head_dim"), name=name)(x)
    q = heads(cfg.num_heads, "heads", "q_proj")
    k = heads(cfg.num_kv_heads, "kv_heads", "k_proj")
    v = heads(cfg.num_kv_heads, "kv_heads", "v_proj")
    inv_freq, factor = rope_inverse_frequencies(cfg)
    q, k = apply_multimodal_rotary_pos_emb(q, k, positions, inv_freq, self.mrope_section, factor)
    cache = {"kt": write_cache(layer_cache["kt"], k.transpose(0, 2, 3, 1), offset, axis=3),
             "v": write_cache(layer_cache["v"], v.transpose(0, 2, 1, 3), offset, axis=2)}
    out = grouped_query_attention(q, cache["kt"], cache["v"], mask, keys_transposed=True,
                                  query_pre_attn_scalar=cfg.query_pre_attn_scalar)
    out = nn.DenseGeneral(cfg.hidden_size, axis=(-2, -1), use_bias=False, dtype=cfg.dtype,
                          param_dtype=cfg.param_dtype,
                          kernel_init=with_axes(normal_init, "heads", "head_dim", "embed"),
                          name="o_proj")(out)
    return out, cache


class CachedMropeLayer(nn.Module):
  """qwen2_5_vl_model.MropeLayer with CachedMropeAttention: (x, positions, mask, layer cache,
  offset) -> (x, layer cache)."""
  cfg: ModelConfig
  mrope_section: tuple

  @nn.compact
  def __call__(self, x, positions, mask, layer_cache, offset):
    cfg = self.cfg
    attn = CachedMropeAttention(cfg, self.mrope_section, name="self_attn")
    mlp = cfg.blocks.mlp(cfg)
    stream = cfg.blocks.layer(cfg, attn, lambda h: mlp(h, None, None))
    return stream(x, positions, mask, layer_cache, offset)


def init_stacked_cache(cfg: ModelConfig, batch: int, slots: int) -> dict:
  """A zeroed cache of `slots` slots, kv_cache.init_cache's per-layer arrays stacked over the
  layers: {"kt": (L, B, Hkv, D, S), "v": (L, B, Hkv, S, D)}."""
  return jax.tree.map(lambda *layers: jnp.stack(layers), *init_cache(cfg, batch, slots))


def lm_head(text_params, x, cfg: ModelConfig) -> jax.Array:
  """(B, T, vocab) float32 logits of the final hidden states x: the final norm, then
  qwen2_5_vl_model.project_vocab (lm_head or the tied embedding table's transpose, float32
  accumulation)."""
  x = _FinalNorm(cfg).apply({"params": {"norm": text_params["norm"]}}, x)
  return project_vocab(text_params, x, cfg)


def cached_decoder(text_params, x, positions, kv_mask, cache, offset, cfg: VlmConfig,
                   last_only: bool = True):
  """(logits, cache) of the decoder on embeddings x (B, T, E) written at cache slots
  [offset, offset + T) (module docstring); logits (B, 1, vocab) of the last position when
  last_only, else (B, T, vocab), float32. kv_mask (B, S) bool over the cache's S slots."""
  mask = causal_mask(jnp.asarray(kv_mask, bool), x.shape[1], offset)
  layer = CachedMropeLayer(cfg.text, cfg.mrope_section)
  positions = jnp.asarray(positions)

  # The cache rides in the carry, layer i's part read and written back at index i, so that
  # XLA updates it in place (as scan outputs, a new stacked cache each call).
  def step(carry, inputs):
    h, cache = carry
    i, layer_params = inputs
    layer_cache = jax.tree.map(lambda c: c[i], cache)
    h, layer_cache = layer.apply({"params": layer_params}, h, positions, mask, layer_cache,
                                 offset)
    return (h, jax.tree.map(lambda c, u: c.at[i].set(u), cache, layer_cache)), None

  layers = jnp.arange(cfg.text.num_layers)
  (x, cache), _ = jax.lax.scan(step, (x, cache), (layers, text_params["layers"]))
  return lm_head(text_params, x[:, -1:] if last_only else x, cfg.text), cache
