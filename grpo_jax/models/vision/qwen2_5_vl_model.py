"""The whole Qwen2.5-VL model's forward pass (issue 57): token ids and images -> next-token
logits, equal to transformers 5's ``Qwen2_5_VLForConditionalGeneration`` (float32, 1e-4).

    logits = vlm_logits(params, input_ids, attention_mask, pixel_values, image_grid_thw, cfg)

1. text embeddings: ``embed_tokens[input_ids]`` (B, T, E);
2. image features: the vision encoder (qwen2_5_vl.encode_images) on the processor's
   pixel_values, (num_image_tokens, E), written at the image placeholder tokens in row-major
   order (placeholders.merge_image_features, HF's masked_scatter);
3. positions: the 3-D (temporal, height, width) ids of mrope.mrope_position_ids (HF's
   get_rope_index), padding skipped;
4. the text decoder, Qwen2's: per layer the family's residual stream (models/blocks.py
   ``Blocks.layer``: x + attn(norm(x)), then + mlp(norm(.))) with the family's norms and MLP;
   attention is grouped-query (attention.grouped_query_attention) under the causal mask
   restricted to ``attention_mask`` (attention.attention_mask), q and k rotated by mRoPE
   (mrope.apply_multimodal_rotary_pos_emb) instead of the 1-D RoPE of models/decoder.py;
5. the final norm, then lm_head (or the embedding table's transpose when tied), float32.

The decoder's params are models/decoder.py's layout (``init_params(cfg.text, key)``: the
layers stacked, the same module names), so the text families' loading, sharding axes and
export tables apply to them; here the layers run one after the other through one
``jax.lax.scan`` of a small Flax layer whose attention takes the (3, B, T) positions.

Memory (not maths), the text families' fields on ``cfg.text``: ``remat`` names what each
scanned layer keeps for its backward pass (models/decoder.py REMAT_POLICIES: "none", "full",
"save_dots", "save_dots_no_batch"; the rest is recomputed), and ``logits_chunk`` = C > 0 scores
the completion C positions at a time (`completion_token_logprobs`, models/scoring.py's
scheme), so that no (B, N, vocab) float32 array exists; 0: in one piece.
The log-probs of the update are always projected from the completion's positions only.

Params: ``{"vision": encoder params, "text": decoder params}``; loading from Hugging Face:
qwen2_5_vl_model_hf.py. Generation without a KV cache (each step recomputes the whole
sequence): `greedy_generate`.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.attention import attention_mask as causal_mask, grouped_query_attention
from grpo_jax.models.blocks import normal_init, with_axes
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import REMAT_POLICIES, init_params
from grpo_jax.models.scoring import chunked_logprobs_and_entropy, token_logprobs_and_entropy
from grpo_jax.models.vision.mrope import (apply_multimodal_rotary_pos_emb, decode_position_ids,
                                          mrope_frequency_axes, mrope_position_ids)
from grpo_jax.models.vision.placeholders import check_image_features, merge_image_features
from grpo_jax.models.vision.qwen2_5_vl import (VisionConfig, check_vision_config,
                                               encode_images, init_vision_params)


@dataclasses.dataclass(frozen=True)
class VlmConfig:
  """A Qwen2.5-VL model: its text decoder (a Qwen2 ModelConfig), its vision encoder, the
  mRoPE split of the head's frequencies (rope_parameters.mrope_section) and the image
  placeholder token id."""

  text: ModelConfig
  vision: VisionConfig
  mrope_section: tuple
  image_token_id: int = 151655
  # (t, gh, gw) patches of every image when the model is the RL loop's policy (one image size
  # per run; rollout/vlm_policy.py); unused by the functions of this module.
  image_grid: tuple = (1, 2, 2)
  # False: the vision tower is frozen in RL (no update, no weight decay; model.vision.train_tower).
  train_tower: bool = True

  def __getattr__(self, name):
    """The text decoder's fields (vocab_size, dtype, num_experts, ...) read through: where the
    loop takes a model config, the VLM's is its decoder's plus the vision tower."""
    if name.startswith("__") or name in ("text", "vision"):
      raise AttributeError(name)
    return getattr(self.text, name)

  def __post_init__(self):
    mrope_frequency_axes(self.mrope_section, self.text.head_dim)  # ConfigError when it's off
    check_vision_config(self.vision)
    if self.text.remat not in REMAT_POLICIES:
      raise ConfigError(f"remat={self.text.remat!r}; use one of {', '.join(REMAT_POLICIES)}.")
    if int(self.text.logits_chunk) < 0:
      raise ConfigError(f"logits_chunk={self.text.logits_chunk}; use 0 (the completion in one "
                        f"piece) or a positive number of positions.")


def rope_inverse_frequencies(cfg: ModelConfig):
  """(inv_freq (D / 2,), attention factor) of the text decoder: the config's rope type
  (cfg.rope_frequencies()), or the default theta^(-2i / D) in float32 as HF computes it. The
  one rule of MropeAttention and the cached decoder (qwen2_5_vl_cached.py)."""
  inv_freq, factor = cfg.rope_frequencies()
  if inv_freq is None:
    exponents = np.arange(0, cfg.head_dim, 2, dtype=np.float32) / np.float32(cfg.head_dim)
    inv_freq = np.float32(1.0) / np.power(np.float32(cfg.rope_theta), exponents)
  return inv_freq, factor


class MropeAttention(nn.Module):
  """Qwen2's self-attention (q/k/v with biases when cfg.qkv_bias, grouped kv heads) with q and
  k rotated by mRoPE at positions (3, B, T); param names as models/decoder.Attention's."""
  cfg: ModelConfig
  mrope_section: tuple

  @nn.compact
  def __call__(self, x, positions, mask):
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
    out = grouped_query_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask,
                                  query_pre_attn_scalar=cfg.query_pre_attn_scalar)
    return nn.DenseGeneral(cfg.hidden_size, axis=(-2, -1), use_bias=False, dtype=cfg.dtype,
                           param_dtype=cfg.param_dtype,
                           kernel_init=with_axes(normal_init, "heads", "head_dim", "embed"),
                           name="o_proj")(out)


class MropeLayer(nn.Module):
  """One decoder layer: the family's residual stream, norms and MLP (cfg.blocks) around
  MropeAttention. (x (B, T, E), positions (3, B, T), mask (B, T, T)) -> x."""
  cfg: ModelConfig
  mrope_section: tuple

  @nn.compact
  def __call__(self, x, positions, mask):
    cfg = self.cfg
    attn = MropeAttention(cfg, self.mrope_section, name="self_attn")
    mlp = cfg.blocks.mlp(cfg)
    stream = cfg.blocks.layer(cfg, lambda h, p, m: (attn(h, p, m), None),
                              lambda h: mlp(h, None, None))
    return stream(x, positions, mask)[0]


class _FinalNorm(nn.Module):
  """The family's final norm, named "norm" as in the decoder's params."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x):
    return self.cfg.blocks.norm(self.cfg, "norm")(x)


def embed_text(text_params, input_ids, cfg: ModelConfig) -> jax.Array:
  """(B, T, E) embeddings: embed_tokens[input_ids], times the family's scale if it has one."""
  x = jnp.take(jnp.asarray(text_params["embed_tokens"]["embedding"], cfg.dtype),
               jnp.asarray(input_ids), axis=0)
  scale = cfg.blocks.embed_scale(cfg)
  return x if scale is None else x * jnp.asarray(scale, cfg.dtype)


def decoder_hidden(text_params, input_ids, kv_mask, image_features, positions,
                   cfg: VlmConfig, placeholder_ids=None) -> jax.Array:
  """(B, T, E) final-normed hidden states of the text decoder on the merged embeddings (the
  inputs of the vocabulary projection), each scanned layer rematerialised by cfg.text.remat.

  input_ids (B, T); kv_mask (B, T) (False: padding, never attended to); image_features
  (N, E), one row per image token of the batch (row-major); positions (3, B, T) mRoPE ids;
  placeholder_ids (B, T): where the image tokens are (None: input_ids; generation passes the
  prompt's, so that a generated image token id keeps its text embedding, as in HF's decode)."""
  text = cfg.text
  placeholder_ids = input_ids if placeholder_ids is None else placeholder_ids
  x = merge_image_features(embed_text(text_params, input_ids, text), placeholder_ids,
                           image_features, cfg.image_token_id)
  mask = causal_mask(jnp.asarray(kv_mask, bool), x.shape[1], 0)
  layer = MropeLayer(text, cfg.mrope_section)
  positions = jnp.asarray(positions)

  def step(h, layer_params):
    return layer.apply({"params": layer_params}, h, positions, mask), None

  policy = REMAT_POLICIES[text.remat]
  if policy is not None:
    step = jax.checkpoint(step, policy=policy, prevent_cse=False)
  x, _ = jax.lax.scan(step, x, text_params["layers"])
  return _FinalNorm(text).apply({"params": {"norm": text_params["norm"]}}, x)


def project_vocab(text_params, hidden, cfg: ModelConfig) -> jax.Array:
  """(..., vocab) float32 logits of normed hidden states (..., E): lm_head, or the embedding
  table's transpose when tied, in the compute dtype with float32 accumulation."""
  head = (jnp.asarray(text_params["embed_tokens"]["embedding"], cfg.dtype).T
          if cfg.tie_embeddings else jnp.asarray(text_params["lm_head"]["kernel"], cfg.dtype))
  return jnp.einsum("...e,ev->...v", hidden, head, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnums=(5,))
def decoder_logits(text_params, input_ids, kv_mask, image_features, positions,
                   cfg: VlmConfig, placeholder_ids=None) -> jax.Array:
  """(B, T, vocab) float32 logits of the text decoder on the merged embeddings:
  project_vocab(decoder_hidden(...)); the arguments as decoder_hidden's."""
  hidden = decoder_hidden(text_params, input_ids, kv_mask, image_features, positions, cfg,
                          placeholder_ids)
  return project_vocab(text_params, hidden, cfg.text)


def completion_token_logprobs(text_params, input_ids, kv_mask, image_features, positions,
                              cfg: VlmConfig, placeholder_ids, prompt_len: int,
                              temperature: float = 1.0) -> jax.Array:
  """(B, N) float32 log pi(input_ids[:, P + k]) of the N = T - P completion tokens under
  teacher forcing, pi = softmax(logits / T) at position P + k - 1; only those N positions of
  decoder_hidden are projected onto the vocabulary: with cfg.text.logits_chunk = C > 0, C at a
  time, each chunk rematerialised (scoring.chunked_logprobs_and_entropy with this model's
  project_vocab; one (B, C, vocab) array at a time), else at once
  (scoring.token_logprobs_and_entropy, the text families' and the sampler's arithmetic).
  Differentiable; unmasked."""
  hidden = decoder_hidden(text_params, input_ids, kv_mask, image_features, positions, cfg,
                          placeholder_ids)[:, prompt_len - 1:-1]
  targets = jnp.asarray(input_ids)[:, prompt_len:]
  if cfg.text.logits_chunk:
    return chunked_logprobs_and_entropy(
        text_params, cfg.text, hidden, targets, temperature, cfg.text.logits_chunk,
        project=lambda h: project_vocab(text_params, h, cfg.text))[0]
  return token_logprobs_and_entropy(project_vocab(text_params, hidden, cfg.text), targets,
                                    temperature)[0]


def image_features(params, pixel_values, image_grid_thw, cfg: VlmConfig) -> jax.Array:
  """(num_image_tokens, E) encoder outputs of the images, or (0, E) without images."""
  if image_grid_thw is None or len(np.asarray(image_grid_thw).reshape(-1, 3)) == 0:
    return jnp.zeros((0, cfg.text.hidden_size), cfg.text.dtype)
  return encode_images(params["vision"], pixel_values, np.asarray(image_grid_thw), cfg.vision)


def vlm_logits(params, input_ids, attention_mask, pixel_values, image_grid_thw,
               cfg: VlmConfig) -> jax.Array:
  """(B, T, vocab) float32 logits of Qwen2.5-VL (module docstring), HF's
  ``Qwen2_5_VLForConditionalGeneration(...).logits``.

  input_ids (B, T) with the placeholders expanded (placeholders.expand_image_placeholders);
  attention_mask (B, T), 1 on real tokens (left or right padding; None: all real);
  pixel_values (N, C*T*P*P) and image_grid_thw (num_images, 3) from the image processor, the
  images in the order of their placeholder runs across the batch (None: no images). Host
  data: the positions and the checks run on the host (ConfigError before any compute)."""
  ids = np.asarray(input_ids)
  mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) > 0
  positions, _ = mrope_position_ids(ids, image_grid_thw, mask, image_token_id=cfg.image_token_id,
                                    merge_size=cfg.vision.spatial_merge_size)
  features = image_features(params, pixel_values, image_grid_thw, cfg)
  check_image_features(ids, features, image_token_id=cfg.image_token_id)
  return decoder_logits(params["text"], ids, mask, features, positions, cfg)


def greedy_generate(params, input_ids, attention_mask, pixel_values, image_grid_thw,
                    cfg: VlmConfig, num_tokens: int) -> np.ndarray:
  """(B, num_tokens) greedy (argmax) continuations of left-padded prompts, every step
  recomputing the whole sequence (no KV cache). The k-th new token sits at mRoPE id
  n + k + rope_delta on the three axes (mrope.decode_position_ids, HF's decode rule); the
  sequence is laid out at its final length from the start, the unfilled slots masked, so one
  compiled program serves every step."""
  ids = np.asarray(input_ids)
  mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) > 0
  batch, prompt_len = ids.shape
  positions, deltas = mrope_position_ids(ids, image_grid_thw, mask,
                                         image_token_id=cfg.image_token_id,
                                         merge_size=cfg.vision.spatial_merge_size)
  features = image_features(params, pixel_values, image_grid_thw, cfg)
  check_image_features(ids, features, image_token_id=cfg.image_token_id)
  new_positions = np.asarray(decode_position_ids(deltas, mask.sum(-1), np.arange(num_tokens)))
  all_positions = np.concatenate([positions, new_positions], axis=-1)
  tokens = np.concatenate([ids, np.zeros((batch, num_tokens), ids.dtype)], axis=1)
  kv_mask = np.concatenate([mask, np.zeros((batch, num_tokens), bool)], axis=1)
  placeholders = np.concatenate([ids, np.full((batch, num_tokens), -1, ids.dtype)], axis=1)
  for k in range(num_tokens):
    logits = decoder_logits(params["text"], tokens, kv_mask, features, all_positions, cfg,
                            placeholders)
    last = prompt_len + k - 1
    tokens[:, last + 1] = np.asarray(jnp.argmax(logits[:, last], axis=-1))
    kv_mask[:, last + 1] = True
  return tokens[:, prompt_len:]


def init_vlm_params(cfg: VlmConfig, key: jax.Array):
  """Random params {"vision": ..., "text": ...} (the text decoder's as models/decoder.py's)."""
  vision_key, text_key = jax.random.split(key)
  return {"vision": init_vision_params(cfg.vision, vision_key),
          "text": init_params(cfg.text, text_key)}
