"""Where each patch of a Qwen2.5-VL image batch goes, computed on the host in NumPy from
``image_grid_thw`` (static per call): its 2-D rotary position, its window, and the order the
ViT's blocks see it in.

Patch order. Hugging Face's image processor writes an image of ``t x h x w`` patches (``h`` and
``w`` multiples of the merge size ``m``) merge-block-major: the ``m x m`` patches one LLM token
is merged from are contiguous, blocks row-major over the ``h/m x w/m`` grid, frames after
frames. A *unit* is such a block of ``m*m`` patches.

Windows. A window is ``ws x ws`` units, ``ws = window_size // m // patch_size``; an image's
units are cut into ``ceil(h/m / ws) x ceil(w/m / ws)`` windows per frame (the last row and
column of windows smaller), windows row-major, units row-major inside a window.
``window_index`` lists the units in that order (transformers' ``get_vision_window_index``); the
encoder permutes its tokens by it before the blocks and back by ``argsort(window_index)`` after
the merger. Full-attention blocks attend within a frame, window blocks within a window; both
are given here as one segment id per token in the permuted order, and as SegmentBlocks: the
segments (each contiguous in that order) grouped by length, so that attention runs per segment
with static shapes and never forms an (N, N) score matrix.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from grpo_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class PatchLayout:
  """The host-side layout of one call's patches (N patches, U = N / m^2 units), every array in
  the window order the blocks see except window_index / reverse_index, which map units."""
  window_index: np.ndarray  # (U,) int32: unit at window-order slot i
  reverse_index: np.ndarray  # (U,) int32: argsort(window_index), back to the processor's order
  positions: np.ndarray  # (N, 2) int32: (row, column) patch coordinates within its image
  frame_segments: np.ndarray  # (N,) int32: one id per (image, frame): full attention
  window_segments: np.ndarray  # (N,) int32: one id per window: window attention


def check_grid(grid_thw, spatial_merge_size: int) -> np.ndarray:
  """grid_thw as an (num_images, 3) int64 array, or one sentence naming the bad entry."""
  grid = np.asarray(grid_thw)
  if grid.ndim != 2 or grid.shape[1] != 3 or len(grid) == 0:
    raise ConfigError(f"image_grid_thw has shape {grid.shape}; pass the image processor's "
                      f"(num_images, 3) array of (t, h, w) patch counts.")
  grid = grid.astype(np.int64)
  for i, (t, h, w) in enumerate(grid.tolist()):
    if t < 1 or h < 1 or w < 1 or h % spatial_merge_size or w % spatial_merge_size:
      raise ConfigError(f"image_grid_thw[{i}] = {(t, h, w)}; t, h and w must be >= 1 with h "
                        f"and w multiples of spatial_merge_size={spatial_merge_size}: pass "
                        f"the grid the image processor returned.")
  return grid


def unit_positions(t: int, h: int, w: int, m: int) -> np.ndarray:
  """(t*h*w, 2) (row, column) of each patch of one image in the processor's merge-block-major
  order (transformers' ``get_vision_position_ids``)."""
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  block = lambda a: a.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)  # noqa: E731
  return np.tile(np.stack([block(rows), block(cols)], axis=-1), (t, 1))


def image_windows(t: int, h: int, w: int, m: int, ws: int) -> list:
  """One image's windows, in order: each a 1-D array of its unit indices (local to the image),
  frame by frame, windows row-major, units row-major within a window."""
  units = np.arange(t * (h // m) * (w // m)).reshape(t, h // m, w // m)
  return [frame[r:r + ws, c:c + ws].reshape(-1)
          for frame in units
          for r in range(0, h // m, ws)
          for c in range(0, w // m, ws)]


def patch_layout(grid_thw, spatial_merge_size: int, window_units: int) -> PatchLayout:
  """The PatchLayout of images with these (t, h, w) patch grids; window_units = ws (see the
  module docstring)."""
  m, unit = spatial_merge_size, spatial_merge_size ** 2
  grid = check_grid(grid_thw, m)
  order, unit_window, unit_frame, positions = [], [], [], []
  offset = frames = windows = 0
  for t, h, w in grid.tolist():
    per_frame = (h // m) * (w // m)
    for window in image_windows(t, h, w, m, window_units):
      order.append(window + offset)
      unit_window.append(np.full(len(window), windows))
      unit_frame.append(frames + window // per_frame)
      windows += 1
    positions.append(unit_positions(t, h, w, m))
    offset += t * per_frame
    frames += t
  window_index = np.concatenate(order).astype(np.int32)
  positions = np.concatenate(positions).reshape(-1, unit, 2)[window_index].reshape(-1, 2)
  return PatchLayout(window_index=window_index,
                     reverse_index=np.argsort(window_index).astype(np.int32),
                     positions=positions.astype(np.int32),
                     frame_segments=_per_patch(unit_frame, unit),
                     window_segments=_per_patch(unit_window, unit))


@dataclasses.dataclass(frozen=True)
class SegmentBlocks:
  """Segments grouped by length: groups[g] (n_g, len_g) int32 holds the token indices of the
  n_g segments of length len_g (ascending lengths, segments and tokens in order); inverse (N,)
  int32 is each token's row in concatenate([g.reshape(-1) for g in groups]), so that
  concat(per-group outputs)[inverse] puts them back in token order."""
  groups: tuple
  inverse: np.ndarray


def segment_blocks(segments: np.ndarray) -> SegmentBlocks:
  """The SegmentBlocks of per-token segment ids (N,) whose segments are contiguous runs."""
  starts = np.flatnonzero(np.diff(segments, prepend=-1) != 0)
  lengths = np.diff(np.append(starts, len(segments)))
  if len(np.unique(segments)) != len(starts):
    raise ValueError("segment ids must form contiguous runs")
  groups = tuple((starts[lengths == n][:, None] + np.arange(n)).astype(np.int32)
                 for n in np.unique(lengths))
  inverse = np.empty(len(segments), np.int32)
  inverse[np.concatenate([g.reshape(-1) for g in groups])] = np.arange(len(segments))
  return SegmentBlocks(groups=groups, inverse=inverse)


def _per_patch(per_unit: list, unit: int) -> np.ndarray:
  """Per-unit values (a list of arrays) repeated for each of a unit's patches, as int32."""
  return np.repeat(np.concatenate(per_unit), unit).astype(np.int32)
