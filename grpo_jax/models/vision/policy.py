"""A Qwen2.5-VL model as the RL loop's policy: every prompt row carries one image of the run's
grid, `VlmConfig.image_grid` = (1, gh, gw) patches (the task resizes every image to one size),
so a batch's images are one array, pixel_values (B, gh * gw, C*T*P*P) in the image processor's
patch order (data/vision_processor.py), and every shape is static under jit.

    positions   `fixed_grid_positions`: HF's get_rope_index (mrope.mrope_position_ids) computed
                inside jit for rows with one image run of a known grid (or none); equal to the
                host rule on every real token (tests/test_vlm_policy.py).
    prompts     `vlm_prompt_inputs`: the images encoded, the features merged into the prompt's
                embeddings, their mRoPE ids and each row's first completion id: the
                PromptInputs (models/prompt_inputs.py) with which every engine of rollout/
                prefills and decodes, as it does a text prompt.
    loss        the same inputs to scoring.completion_scores (train/learner/forward.py): the
                completion tokens scored at the ids the sampler gave them, the image features
                at the prompt's placeholders only (a sampled image token id keeps its text
                embedding); the loss is over text tokens.
    LoRA        `vlm_policy_params`: LoraParams (learner/state.py policy_params) -> the plain
                {"vision", "text"} dict both read (models/vision/build.py's docstring).

The sampler's and the update's log-probs of the same rows agree to float32 rounding, and
another image changes both (tests/test_vlm_policy.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.lora import LoraParams, merge
from grpo_jax.models.prompt_inputs import PromptInputs
from grpo_jax.models.vision.mrope import image_token_count
from grpo_jax.models.vision.qwen2_5_vl import encode_images
from grpo_jax.models.vision.qwen2_5_vl_model import VlmConfig, merged_embeddings


def image_tokens(cfg: VlmConfig) -> int:
  """The placeholder tokens of one image of the run's grid: t * gh * gw / merge^2."""
  return image_token_count(cfg.image_grid, cfg.vision.spatial_merge_size)


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


def vlm_prompt_inputs(params, prompt_tokens, prompt_mask, pixel_values, cfg: VlmConfig):
  """(the decoder's params, PromptInputs) of image + text prompts (B, P) with their images
  (B, patches, dim): the embeddings with the image features at the placeholders, the (3, B, P)
  mRoPE ids, and n + rope_delta, the id of completion token 0 (n: the row's real tokens)."""
  params = vlm_policy_params(params, cfg)
  features = row_image_features(params["vision"], pixel_values, cfg)
  positions, delta = fixed_grid_positions(prompt_tokens, prompt_mask, cfg)
  lengths = jnp.sum(prompt_mask.astype(jnp.int32), axis=1)
  embeddings = merged_embeddings(params["text"], prompt_tokens, features, cfg)
  return params["text"], PromptInputs(embeddings, positions, lengths + delta)
