"""Qwen2.5-VL prompts with images of any grid, on the host's terms (the processor's
pixel_values and image_grid_thw), through the one sampler and the one teacher-forced pass.

`vlm_sample`: the images encoded once (qwen2_5_vl_model.image_features), the features merged
into each prompt's embeddings at its placeholders, the prompt at its 3-D mRoPE ids
(mrope.mrope_position_ids) and completion token k at n + k + rope_delta on all three axes (n:
the row's real prompt tokens; mrope.decode_position_ids): the PromptInputs
(models/prompt_inputs.py) with which the static engine (rollout/static.py) prefills each
prompt once for its G rows and decodes, as it does text. Token k of row r (r = prompt x G +
sample, or row_ids[r]) is drawn with the text sampler's `token_uniforms(key, r, k)`, so a draw
depends on (key, row, position) only; its log-prob is that of pi = softmax(logits / T)
(T = 0: greedy). A row ends after emitting eos_id: later slots are pad_id, log-prob 0, mask
False.

`host_prompt_inputs` gives the same inputs, each prompt's repeated for its G rows, to the
teacher-forced pass (models/scoring.completion_scores).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from grpo_jax.models.prompt_inputs import PromptInputs
from grpo_jax.models.vision.mrope import mrope_position_ids
from grpo_jax.models.vision.placeholders import check_image_features
from grpo_jax.models.vision.qwen2_5_vl_model import VlmConfig, image_features, merged_embeddings
from grpo_jax.rollout.sampler import Sampling, _sample
from grpo_jax.rollout.types import check_per_row

NO_EOS = -1  # eos_id=None: no token ends a row


def host_prompt_inputs(params, input_ids, attention_mask, pixel_values, image_grid_thw,
                       cfg: VlmConfig, group_size: int = 1):
  """(ids, mask, PromptInputs of the prompts' rows repeated group_size times) on the host: the
  mRoPE ids and the image features, checked (ConfigError before any decoder compute)."""
  ids = np.asarray(input_ids)
  mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) > 0
  positions, deltas = mrope_position_ids(ids, image_grid_thw, mask,
                                         image_token_id=cfg.image_token_id,
                                         merge_size=cfg.vision.spatial_merge_size)
  features = image_features(params, pixel_values, image_grid_thw, cfg)
  check_image_features(ids, features, image_token_id=cfg.image_token_id)
  features = repeat_image_features(features, ids, group_size, cfg.image_token_id)
  ids, mask, deltas = (np.repeat(a, group_size, axis=0) for a in (ids, mask, deltas))
  embeddings = merged_embeddings(params["text"], ids, features, cfg)
  inputs = PromptInputs(embeddings, jnp.asarray(np.repeat(positions, group_size, axis=1)),
                        jnp.asarray(deltas[:, 0] + mask.sum(-1), jnp.int32))
  return ids, mask, inputs


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
  sampling = Sampling(cfg.text, int(max_new_tokens), NO_EOS if eos_id is None else eos_id,
                      pad_id, float(temperature), group_size=group_size)  # checked here
  check_per_row(np.shape(input_ids)[0] * group_size, row_ids=row_ids)
  ids, mask, inputs = host_prompt_inputs(params, input_ids, attention_mask, pixel_values,
                                         image_grid_thw, cfg)
  row_ids = None if row_ids is None else jnp.asarray(row_ids, jnp.int32)
  rollout, _ = _sample(params["text"], jnp.asarray(ids), jnp.asarray(mask), key, None, row_ids,
                       inputs=inputs, sampling=sampling)
  return rollout.completion_tokens, rollout.logprobs, rollout.completion_mask


def repeat_image_features(features, input_ids, group_size: int, image_token_id: int):
  """(features of the repeated rows): the rows' image features (row-major over the prompts)
  with each prompt's block repeated group_size times, in the order of the repeated rows'
  image tokens. Host input_ids (B / G, P)."""
  if group_size == 1 or features.shape[0] == 0:
    return features
  counts = (np.asarray(input_ids) == image_token_id).sum(axis=1)
  starts = np.cumsum(counts) - counts
  index = np.concatenate([np.tile(np.arange(s, s + c), group_size)
                          for s, c in zip(starts, counts)])
  return jnp.take(features, jnp.asarray(index, jnp.int32), axis=0)
