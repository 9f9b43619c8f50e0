"""A Qwen2.5-VL model as the RL loop's policy (issue 57): every prompt row carries one image of
the run's grid, `VlmConfig.image_grid` = (1, gh, gw) patches (the task resizes every image to
one size), so a batch's images are one array, pixel_values (B, gh * gw, C*T*P*P) in the image
processor's patch order (data/vision_processor.py), and every shape is static under jit.

    positions   `fixed_grid_positions`: HF's get_rope_index (mrope.mrope_position_ids) computed
                inside jit for rows with one image run of a known grid (or none); equal to the
                host rule on every real token (tests/test_vlm_policy.py).
    sampler     `vlm_rollout`: the images encoded once per prompt, each prompt prefilled once
                and shared by its G rows (rollout/vlm_sampler.py's jitted engine), a Rollout
                whose `images` are each row's pixel_values (the prompt's, repeated G times).
    loss        `vlm_completion_scores`: the teacher-forced pass over prompt + completion with
                the same image features, (log pi, entropy) of the completion tokens only (the
                loss is over text tokens), as forward.policy_and_values returns them.

    LoRA        `vlm_policy_params`: LoraParams (learner/state.py policy_params) -> the plain
                {"vision", "text"} dict both read (models/vision/build.py's docstring).

The sampler's and the update's log-probs of the same rows agree to float32 rounding, and
another image changes both (tests/test_vlm_policy.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.lora import LoraParams, merge
from grpo_jax.models.scoring import chunked_logprobs_and_entropy, token_logprobs_and_entropy
from grpo_jax.models.vision.qwen2_5_vl import encode_images
from grpo_jax.models.vision.qwen2_5_vl_model import VlmConfig, decoder_hidden, project_vocab
from grpo_jax.rollout.prefill import repeat_rows
from grpo_jax.rollout.types import DecodeStats, Rollout, finish
from grpo_jax.rollout.vlm_sampler import _sample


def image_tokens(cfg: VlmConfig) -> int:
  """The placeholder tokens of one image of the run's grid: t * gh * gw / merge^2."""
  t, h, w = cfg.image_grid
  return t * h * w // cfg.vision.spatial_merge_size ** 2


def fixed_grid_positions(ids, mask, cfg: VlmConfig):
  """((3, B, T) int32 mRoPE ids, (B,) int32 rope deltas) of left-padded rows each holding at
  most one contiguous run of image_tokens(cfg) placeholders of grid cfg.image_grid (t = 1):
  text before the image counts 0, 1, ...; the image's token j at start + (0, j // gw', j % gw')
  (gw' = gw / merge); text after it continues from start + max(gh', gw'); padding 0. The delta
  is (largest id + 1) - real tokens. HF's get_rope_index for such rows, inside jit."""
  merge = cfg.vision.spatial_merge_size
  _, gh, gw = (g // m for g, m in zip(cfg.image_grid, (1, merge, merge)))
  count = gh * gw
  mask = mask.astype(bool)
  real = jnp.cumsum(mask, axis=1) - 1  # the text rule's id of each real token
  image = (ids == cfg.image_token_id) & mask
  has = jnp.any(image, axis=1, keepdims=True)
  start = jnp.max(jnp.where(image & (jnp.cumsum(image, axis=1) == 1), real, 0), axis=1,
                  keepdims=True)  # the first image token's text id
  j = jnp.cumsum(image, axis=1) - 1
  extent = max(gh, gw)
  after = has & (real >= start + count)
  text = jnp.where(after, real - count + extent, real)
  axes = [jnp.zeros_like(j), j // gw, j % gw]
  positions = jnp.stack([jnp.where(image, start + a, text) for a in axes])
  positions = jnp.where(mask[None], positions, 0).astype(jnp.int32)
  delta = jnp.where(has[:, 0], extent - count, 0).astype(jnp.int32)
  return positions, delta


def vlm_policy_params(params, cfg: VlmConfig) -> dict:
  """The {"vision", "text"} params the forward reads: plain params as they are; under LoRA
  (LoraParams(base, adapters), adapters = {"text": decoder adapters[, "vision": the trained
  tower]}) the decoder's adapted kernels merged, W + s * A B (lora.merge, s =
  cfg.text.lora_scale: the same function of x as x W + s (x A) B, differentiable in A and B),
  and the trained tower when there is one, else the base's (frozen)."""
  if not isinstance(params, LoraParams):
    return params
  base, adapters = params.base, params.adapters
  return {"vision": adapters.get("vision", base["vision"]),
          "text": merge(base["text"], adapters["text"], cfg.text.lora_scale)}


def row_image_features(vision_params, pixel_values, cfg: VlmConfig) -> jax.Array:
  """(B * image_tokens, E) encoder outputs of B rows' images, row-major (the order in which
  merge_image_features writes a batch's placeholders)."""
  rows = pixel_values.shape[0]
  grids = np.tile(np.asarray(cfg.image_grid, np.int64), (rows, 1))
  flat = pixel_values.reshape(-1, pixel_values.shape[-1]).astype(jnp.float32)
  return encode_images(vision_params, flat, grids, cfg.vision)


def vlm_rollout(params, prompt_tokens, prompt_mask, pixel_values, key, sampling,
                row_ids=None) -> tuple[Rollout, DecodeStats]:
  """The sampler (rollout/sampler.py's `Sampling`, model_cfg a VlmConfig) on image + text
  prompts (B / G, P) with their images (B / G, patches, dim): (a Rollout of B rows whose
  `images` are each row's pixel_values, DecodeStats). Token k of row r is drawn with
  token_uniforms(key, r, k), as the text sampler draws it."""
  s, cfg = sampling, sampling.model_cfg
  params = vlm_policy_params(params, cfg)
  prompts = prompt_tokens.shape[0]
  rows = prompts * s.group_size
  features = row_image_features(params["vision"], pixel_values, cfg)
  positions, delta = fixed_grid_positions(prompt_tokens, prompt_mask, cfg)
  lengths = jnp.sum(prompt_mask.astype(jnp.int32), axis=1)
  row_ids = jnp.arange(rows, dtype=jnp.int32) if row_ids is None else row_ids
  special = jnp.asarray([s.eos_id, s.pad_id], jnp.int32)
  tokens, logps, live = _sample(params["text"], prompt_tokens, prompt_mask.astype(bool),
                                features, positions, delta + lengths, key, row_ids, special,
                                cfg=cfg, max_new_tokens=s.max_new_tokens,
                                temperature=float(s.temperature), group_size=s.group_size)
  prompt_tokens, prompt_mask, images = repeat_rows((prompt_tokens, prompt_mask, pixel_values),
                                                   s.group_size)
  rollout = finish(prompt_tokens, prompt_mask, tokens, live, logps, s.eos_id)
  # Every row runs every step (the static engine's count of decode work).
  stats = DecodeStats(jnp.asarray(rows * s.max_new_tokens, jnp.int32))
  return rollout._replace(images=images), stats


def vlm_completion_scores(params, cfg: VlmConfig, seqs, temperature: float = 1.0):
  """(log pi, entropy), both (B, N) float32 and unmasked, of the completion tokens of `seqs`
  (prompt_tokens, prompt_mask, completion_tokens, completion_mask and images (B, patches,
  dim)) under teacher forcing: completion token k at the mRoPE id the sampler gave it
  (n + k + delta), the image features at the prompt's placeholders only (a sampled image token
  id keeps its text embedding). Only the completion's positions are projected onto the
  vocabulary, cfg.text.logits_chunk at a time when > 0."""
  params = vlm_policy_params(params, cfg)
  prompt_len = seqs.prompt_tokens.shape[1]
  new = seqs.completion_tokens.shape[1]
  prompt_mask = seqs.prompt_mask.astype(bool)
  features = row_image_features(params["vision"], seqs.images, cfg)
  positions, delta = fixed_grid_positions(seqs.prompt_tokens, prompt_mask, cfg)
  base = jnp.sum(prompt_mask.astype(jnp.int32), axis=1) + delta
  decode = jnp.broadcast_to(base[:, None] + jnp.arange(new)[None], (3, base.shape[0], new))
  tokens = jnp.concatenate([seqs.prompt_tokens, seqs.completion_tokens], axis=1)
  kv_mask = jnp.concatenate([prompt_mask, seqs.completion_mask.astype(bool)], axis=1)
  placeholders = jnp.concatenate([seqs.prompt_tokens, jnp.full_like(seqs.completion_tokens, -1)],
                                 axis=1)
  hidden = decoder_hidden(params["text"], tokens, kv_mask, features,
                          jnp.concatenate([positions, decode.astype(jnp.int32)], axis=-1), cfg,
                          placeholders)[:, prompt_len - 1:-1]
  targets = seqs.completion_tokens
  if cfg.text.logits_chunk:
    # (the sampler's projection: float32 accumulation)
    return chunked_logprobs_and_entropy(
        params["text"], cfg.text, hidden, targets, temperature, cfg.text.logits_chunk,
        project=lambda h: project_vocab(params["text"], h, cfg.text))
  return token_logprobs_and_entropy(project_vocab(params["text"], hidden, cfg.text), targets,
                                    temperature)
