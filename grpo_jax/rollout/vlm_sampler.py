"""Images through the sampler and through the loss (issue 57, items 3-4), for Qwen2.5-VL.

Sampler, `vlm_sample`: the images are encoded once (qwen2_5_vl_model.image_features, one pass
over the prompts' images) and each prompt is prefilled once into a KV cache
(qwen2_5_vl_cached.cached_decoder, the image features merged at the placeholder tokens, the
prompt at its 3-D mRoPE ids, mrope.mrope_position_ids); the cache rows, the last position's
logits and the masks are then repeated for the prompt's G = group_size samples, as the text
sampler shares a prompt's prefill (rollout/prefill.py). Decode step k feeds completion token k
at cache slot P + k and mRoPE id n + k + rope_delta on all three axes (n: the row's real prompt
tokens; mrope.decode_position_ids). Token k of row r (r = prompt x G + sample, or row_ids[r])
is drawn with the text sampler's uniform `token_uniforms(key, r, k)` and `choose_tokens`
(rollout/sampling.py), so a draw depends on (key, row, position) only, never on the batch; its
log-prob is the text sampler's, that of pi = softmax(logits / T) over the whole vocabulary
(T = 0: greedy, log-probs of softmax(logits)). A row ends after emitting eos_id: later slots
are pad_id, log-prob 0, mask False.

Update, `vlm_completion_logprobs`: one teacher-forced forward (qwen2_5_vl_model.decoder_hidden)
over prompt + completion with the same image features (encoded once per prompt, repeated for
its G rows), completion token k at the same mRoPE id as in the sampler, a generated image
token id keeping its text embedding (only the prompt's placeholders take image features). It
returns log pi of the completion tokens only (the loss is over text tokens), 0 where the
completion mask is False, projecting only the completion's positions onto the vocabulary (in
chunks of cfg.text.logits_chunk when > 0; the layers rematerialised by cfg.text.remat:
qwen2_5_vl_model.completion_token_logprobs).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.mrope import decode_position_ids, mrope_position_ids
from grpo_jax.models.vision.placeholders import check_image_features, merge_image_features
from grpo_jax.models.vision.qwen2_5_vl_cached import cached_decoder, init_stacked_cache
from grpo_jax.models.vision.qwen2_5_vl_model import (VlmConfig, completion_token_logprobs,
                                                     embed_text, image_features)
from grpo_jax.rollout.prefill import repeat_rows
from grpo_jax.rollout.sampling import choose_tokens, token_uniforms

NO_EOS = -1  # eos_id=None: no token ends a row


def _host_inputs(params, input_ids, attention_mask, pixel_values, image_grid_thw,
                 cfg: VlmConfig):
  """(ids, mask, features, positions (3, B, P), rope_deltas (B,), real lengths (B,)) on the host:
  the mRoPE ids and the image features, checked (ConfigError before any decoder compute)."""
  ids = np.asarray(input_ids)
  mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) > 0
  positions, deltas = mrope_position_ids(ids, image_grid_thw, mask,
                                         image_token_id=cfg.image_token_id,
                                         merge_size=cfg.vision.spatial_merge_size)
  features = image_features(params, pixel_values, image_grid_thw, cfg)
  check_image_features(ids, features, image_token_id=cfg.image_token_id)
  return ids, mask, features, positions, deltas[:, 0], mask.sum(-1)


def check_sampling(max_new_tokens: int, temperature: float, group_size: int, rows: int,
                   row_ids=None) -> None:
  """vlm_sample's settings, checked on the host before any compute (a ConfigError, one
  sentence, otherwise)."""
  if int(max_new_tokens) < 1:
    raise ConfigError(f"max_new_tokens={max_new_tokens}; sample at least 1 token.")
  if int(group_size) < 1:
    raise ConfigError(f"group_size={group_size}; draw at least 1 sample per prompt.")
  if float(temperature) < 0:
    raise ConfigError(f"temperature={temperature}; use 0 (greedy) or a positive temperature.")
  if row_ids is not None and np.shape(row_ids) != (rows,):
    raise ConfigError(f"row_ids has shape {np.shape(row_ids)}, the call samples {rows} rows "
                      f"(prompts x group_size); pass one id per row or None.")


def vlm_sample(params, input_ids, attention_mask, pixel_values, image_grid_thw, key,
               cfg: VlmConfig, max_new_tokens: int, temperature: float = 1.0,
               group_size: int = 1, *, eos_id: int | None = None, pad_id: int = 0,
               row_ids=None):
  """(tokens (B, N) int32, logprobs (B, N) float32, mask (B, N) bool) of group_size samples per
  left-padded image + text prompt (module docstring), B = prompts x G, groups contiguous.

  input_ids (B / G, P), placeholders expanded; attention_mask (B / G, P) (None: all real);
  pixel_values, image_grid_thw: the prompts' images in placeholder order (None: no images);
  temperature 0: greedy; eos_id None: rows run the full N tokens; row_ids (B,) int32: the r
  of each row's draws (None: its index, prompt x G + sample)."""
  rows = np.shape(input_ids)[0] * group_size
  check_sampling(max_new_tokens, temperature, group_size, rows, row_ids)
  ids, mask, features, positions, deltas, lengths = _host_inputs(
      params, input_ids, attention_mask, pixel_values, image_grid_thw, cfg)
  row_ids = jnp.arange(rows, dtype=jnp.int32) if row_ids is None else jnp.asarray(row_ids,
                                                                                  jnp.int32)
  special = jnp.asarray([NO_EOS if eos_id is None else eos_id, pad_id], jnp.int32)
  return _sample(params["text"], ids, mask, features, positions, deltas + lengths, key, row_ids,
                 special, cfg=cfg, max_new_tokens=max_new_tokens,
                 temperature=float(temperature), group_size=group_size)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "temperature",
                                             "group_size"))
def _sample(text_params, ids, mask, features, positions, decode_base, key, row_ids, special, *,
            cfg: VlmConfig, max_new_tokens: int, temperature: float, group_size: int):
  """The jitted sampler: prefill each prompt once, share it G ways, then N - 1 decode steps in a
  lax.scan (the last token is recorded after it). decode_base (B / G,): n + rope_delta, the
  mRoPE id of a prompt's first completion token; special: (eos_id, pad_id), traced (one
  compiled program for every pair)."""
  eos_id, pad_id = special[0], special[1]
  prompts, prompt_len = ids.shape
  slots = prompt_len + max_new_tokens
  x = merge_image_features(embed_text(text_params, ids, cfg.text), ids, features,
                           cfg.image_token_id)
  kv_mask = jnp.concatenate([mask, jnp.zeros((prompts, max_new_tokens), bool)], axis=1)
  logits, cache = cached_decoder(text_params, x, positions, kv_mask,
                                 init_stacked_cache(cfg.text, prompts, slots), 0, cfg)
  # Prefix sharing: the prompt's cache rows (axis 1, after the layers), logits and masks x G.
  cache = repeat_rows(cache, group_size, axis=1)
  logits, kv_mask, decode_base = repeat_rows((logits[:, 0], kv_mask, decode_base), group_size)
  choose = lambda lg, step: choose_tokens(  # noqa: E731
      lg, token_uniforms(key, row_ids, step), temperature, 0, 1.0)[:2]

  def record(step, token, logp, done, kv_mask):
    """Token `step` of the live rows (pad elsewhere): (token, logp, live, done, kv_mask)."""
    live = ~done
    token = jnp.where(live, token, pad_id)
    kv_mask = kv_mask.at[:, prompt_len + step].set(live)
    return token, jnp.where(live, logp, 0.0), live, done | (token == eos_id), kv_mask

  def body(carry, step):
    token, logp, done, cache, kv_mask = carry
    token, logp, live, done, kv_mask = record(step, token, logp, done, kv_mask)
    position = jnp.broadcast_to((decode_base + step)[:, None], (3, token.shape[0], 1))
    x = embed_text(text_params, token[:, None], cfg.text)
    logits, cache = cached_decoder(text_params, x, position, kv_mask, cache,
                                   prompt_len + step, cfg)
    next_token, next_logp = choose(logits[:, 0], step + 1)
    return (next_token, next_logp, done, cache, kv_mask), (token, logp, live)

  token, logp = choose(logits, 0)
  done = jnp.zeros(token.shape, bool)
  (token, logp, done, _, kv_mask), outs = jax.lax.scan(
      body, (token, logp, done, cache, kv_mask), jnp.arange(max_new_tokens - 1))
  last = record(max_new_tokens - 1, token, logp, done, kv_mask)[:3]
  tokens, logps, live = (jnp.concatenate([o.T, l[:, None]], axis=1) for o, l in zip(outs, last))
  return tokens.astype(jnp.int32), logps, live


def repeat_image_features(features, input_ids, group_size: int, image_token_id: int):
  """(features of the repeated rows): the rows' image features (row-major over the prompts)
  with each prompt's block repeated group_size times, in the order of
  repeat_rows(input_ids, group_size)'s image tokens. Host input_ids (B / G, P)."""
  if group_size == 1 or features.shape[0] == 0:
    return features
  counts = (np.asarray(input_ids) == image_token_id).sum(axis=1)
  starts = np.cumsum(counts) - counts
  index = np.concatenate([np.tile(np.arange(s, s + c), group_size)
                          for s, c in zip(starts, counts)])
  return jnp.take(features, jnp.asarray(index, jnp.int32), axis=0)


def vlm_completion_logprobs(params, input_ids, attention_mask, pixel_values, image_grid_thw,
                            completion_tokens, completion_mask, cfg: VlmConfig, *,
                            temperature: float = 1.0, group_size: int = 1) -> jax.Array:
  """(B, N) float32 log pi of the completion tokens under teacher forcing (module docstring),
  0 where completion_mask is False; the prompt's positions (image or text) are never scored.

  input_ids, attention_mask, pixel_values, image_grid_thw: the prompts as vlm_sample takes
  them, (B / G, P); completion_tokens, completion_mask (B, N), groups of G contiguous rows per
  prompt (vlm_sample's output); temperature: the sampler's (pi = softmax(logits / T))."""
  ids, mask, features, positions, deltas, lengths = _host_inputs(
      params, input_ids, attention_mask, pixel_values, image_grid_thw, cfg)
  features = repeat_image_features(features, ids, group_size, cfg.image_token_id)
  ids, mask, deltas, lengths = (np.repeat(a, group_size, axis=0)
                                for a in (ids, mask, deltas, lengths))
  positions = np.repeat(positions, group_size, axis=1)
  completion = np.asarray(completion_tokens).astype(ids.dtype)
  completion_mask = np.asarray(completion_mask).astype(bool)
  prompt_len, new = ids.shape[1], completion.shape[1]
  all_positions = np.concatenate(
      [positions, np.asarray(decode_position_ids(deltas, lengths, np.arange(new)))], axis=-1)
  tokens = np.concatenate([ids, completion], axis=1)
  kv_mask = np.concatenate([mask, completion_mask], axis=1)
  placeholders = np.concatenate([ids, np.full(completion.shape, -1, ids.dtype)], axis=1)
  logp = _teacher_forced(params["text"], tokens, kv_mask, features, all_positions, cfg=cfg,
                         placeholder_ids=placeholders, prompt_len=prompt_len,
                         temperature=float(temperature))
  return jnp.where(jnp.asarray(completion_mask), logp, 0.0)


_teacher_forced = jax.jit(completion_token_logprobs,
                          static_argnames=("cfg", "prompt_len", "temperature"))
