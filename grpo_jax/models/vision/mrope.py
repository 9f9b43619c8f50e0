"""Qwen2.5-VL's multimodal RoPE (mRoPE) on the text side, as transformers 5 defines it
(models/qwen2_5_vl/modeling_qwen2_5_vl.py).

Positions. Every token has three position ids (temporal, height, width). A text token has the
same id on all three, one more than the previous token's largest id. An image's placeholder run
of t * (h / m) * (w / m) tokens (m = spatial_merge_size, (t, h, w) its image_grid_thw in
patches) gets, with s = the position the run starts at,

    temporal = s + i_t,  height = s + i_h,  width = s + i_w,   i_t < t, i_h < h / m, i_w < w / m,

in (i_t, i_h, i_w) row-major order (HF's `get_vision_position_ids` with time_interval 1, as for
still images), and the text after it continues at s + max(h, w) / m (HF's
`current_pos += max(grid_thw[1], grid_thw[2]) // spatial_merge_size`). Left padding is skipped
(its ids are 0) and the real tokens are numbered as if it were not there. `rope_deltas` per row
is (largest id + 1) - (number of real tokens): HF's `mrope_position_deltas`, 0 for a row
without images.

Decode. The k-th generated token (k = 0 for the first) of a row with n real prompt tokens has
id n + k + rope_delta on all three axes, i.e. one past the prompt's largest id plus k: HF's
`compute_3d_position_ids` with a cache, `attention_mask.cumsum(-1) - 1 + rope_deltas`.

Rotation. The D / 2 inverse frequencies (models/rope.py, rope_theta) are split into
`mrope_section` chunks (sum = D / 2; Qwen2.5-VL's is [16, 24, 24] for D = 128); chunk i takes
its angle from axis i % 3, angle_f = position[axis(f)] * inv_freq_f, and the angles are tiled
twice over D and applied in the rotate-half layout of attention.rotary_embedding (HF's
`Qwen2_5_VLRotaryEmbedding.recomposition_frequencies` then `apply_rotary_pos_emb`; transformers
4.x called the pair `apply_multimodal_rotary_pos_emb`). With the three ids equal (a text-only
row) it is plain RoPE.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.attention import apply_rotation


def image_token_count(grid_thw: Sequence[int], merge_size: int) -> int:
  """The placeholder tokens of one image: t * h * w / merge_size^2 (HF's
  `image_grid_thw[i].prod() // merge_size**2`)."""
  t, h, w = (int(v) for v in grid_thw)
  return t * h * w // (merge_size * merge_size)


def vision_position_ids(start: int, grid_thw: Sequence[int], merge_size: int) -> np.ndarray:
  """(3, t * h/m * w/m) int64: start + (i_t, i_h, i_w) over the merged grid, row-major (HF's
  `get_vision_position_ids(start, grid_thw, 1, spatial_merge_size, 1)`)."""
  t, h, w = (int(v) for v in grid_thw)
  grid = np.meshgrid(np.arange(t), np.arange(h // merge_size), np.arange(w // merge_size),
                     indexing="ij")
  return np.stack([g.reshape(-1) for g in grid]).astype(np.int64) + start


def _row_positions(ids: np.ndarray, grids, image_token_id: int, merge_size: int,
                   row: int) -> np.ndarray:
  """(3, len(ids)) ids of one row's real tokens; consumes one grid per image from `grids`."""
  is_image = ids == image_token_id
  pieces, position, i = [], 0, 0
  while i < len(ids):
    if not is_image[i]:
      end = i + 1
      while end < len(ids) and not is_image[end]:
        end += 1
      pieces.append(np.broadcast_to(np.arange(position, position + end - i), (3, end - i)))
      position += end - i
    else:
      grid = next(grids, None)
      if grid is None:
        raise ConfigError(f"row {row} has more image placeholder runs than image_grid_thw has "
                          f"images; pass one (t, h, w) per image, in row order.")
      count = image_token_count(grid, merge_size)
      end = i + count
      if end > len(ids) or not is_image[i:end].all():
        raise ConfigError(f"row {row}: an image of grid {tuple(int(v) for v in grid)} needs "
                          f"{count} consecutive image tokens; expand the placeholders with "
                          f"placeholders.expand_image_placeholders first.")
      pieces.append(vision_position_ids(position, grid, merge_size))
      position += max(int(grid[1]), int(grid[2])) // merge_size
    i = end
  return np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), np.int64)


def mrope_position_ids(input_ids, image_grid_thw, attention_mask=None, *, image_token_id: int,
                       merge_size: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """(position_ids (3, B, T) int64, rope_deltas (B, 1) int64) of left- (or right-) padded rows,
  equal to HF's `Qwen2_5_VLModel.get_rope_index` (module docstring for the rule).

  input_ids (B, T); image_grid_thw (num_images, 3), the images in row-major order of their
  placeholder runs across the batch (None: no images); attention_mask (B, T), 1 on real tokens
  (None: all real). Padding gets id 0. Images may be adjacent: each consumes exactly its own
  token count. A count that does not match image_grid_thw is a ConfigError.
  """
  ids = np.asarray(input_ids)
  mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) > 0
  grids = iter(np.zeros((0, 3), np.int64) if image_grid_thw is None
               else np.asarray(image_grid_thw, np.int64).reshape(-1, 3))
  positions = np.zeros((3, *ids.shape), np.int64)
  deltas = np.zeros((ids.shape[0], 1), np.int64)
  for row in range(ids.shape[0]):
    real = _row_positions(ids[row][mask[row]], grids, image_token_id, merge_size, row)
    positions[:, row, mask[row]] = real
    if real.shape[1]:
      deltas[row, 0] = real.max() + 1 - real.shape[1]
  if next(grids, None) is not None:
    raise ConfigError(f"image_grid_thw has {len(np.asarray(image_grid_thw).reshape(-1, 3))} "
                      f"images but the rows hold fewer placeholder runs; pass one (t, h, w) per "
                      f"image in the rows.")
  return positions, deltas


def decode_position_ids(rope_deltas: jax.Array, prompt_lengths: jax.Array,
                        steps: jax.Array) -> jax.Array:
  """(3, B, K) ids of generated tokens: prompt_length + step + rope_delta, equal on the three
  axes (HF's `attention_mask.cumsum(-1) - 1 + rope_deltas` during decode).

  rope_deltas (B, 1) or (B,) from mrope_position_ids; prompt_lengths (B,), real (unpadded)
  prompt tokens per row; steps (K,), which generated tokens (0 = the first).
  """
  base = jnp.asarray(prompt_lengths).reshape(-1) + jnp.asarray(rope_deltas).reshape(-1)
  ids = base[:, None] + jnp.asarray(steps).reshape(1, -1)
  return jnp.broadcast_to(ids, (3, *ids.shape))


def mrope_frequency_axes(mrope_section: Sequence[int], head_dim: int) -> np.ndarray:
  """(head_dim / 2,) int: which position axis (0 temporal, 1 height, 2 width) each inverse
  frequency reads: chunk i of `mrope_section` reads axis i % 3. A section that does not cover
  head_dim / 2 frequencies is a ConfigError."""
  if sum(mrope_section) != head_dim // 2 or head_dim % 2:
    raise ConfigError(f"mrope_section={list(mrope_section)} sums to {sum(mrope_section)}, not "
                      f"head_dim / 2 = {head_dim // 2}; use the rope_parameters.mrope_section of "
                      f"the checkpoint's config.json.")
  return np.repeat(np.arange(len(mrope_section)) % 3, mrope_section)


def mrope_angles(positions: jax.Array, inv_freq, mrope_section: Sequence[int]) -> jax.Array:
  """(B, T, D) angles: angle_f = positions[axis(f)] * inv_freq_f (f < D / 2), tiled twice.
  positions (3, B, T); inv_freq (D / 2,)."""
  inv_freq = np.asarray(inv_freq, np.float32)
  axes = mrope_frequency_axes(mrope_section, 2 * inv_freq.shape[0])
  per_frequency = jnp.asarray(positions)[axes].astype(jnp.float32)  # (D/2, B, T)
  angles = jnp.moveaxis(per_frequency, 0, -1) * inv_freq  # (B, T, D/2)
  return jnp.concatenate([angles, angles], axis=-1)


def apply_mrope(x: jax.Array, positions: jax.Array, inv_freq, mrope_section: Sequence[int],
                attention_factor: float = 1.0) -> jax.Array:
  """x * cos + rotate_half(x) * sin with the mRoPE angles (mrope_angles), cos and sin scaled by
  the attention factor, computed in float32 and cast back to x's dtype.
  x (B, T, H, D); positions (3, B, T)."""
  angles = mrope_angles(positions, inv_freq, mrope_section)[:, :, None, :]
  return apply_rotation(x, jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor)
