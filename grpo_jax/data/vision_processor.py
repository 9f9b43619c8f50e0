"""Qwen2-VL / Qwen2.5-VL image preprocessing in NumPy (+ Pillow for the resize): uint8 RGB images
to the model's `pixel_values` and `image_grid_thw`, equal to transformers 5's
`Qwen2VLImageProcessor` (which, without torchvision, is `Qwen2VLImageProcessorPil`) without torch.

Per image (HF's `Qwen2VLImageProcessorPil._preprocess`), with HF's names and defaults:

1. smart_resize (HF's `smart_resize`), factor = patch_size * merge_size (14 * 2 = 28):
     h_bar = round(H / factor) * factor, w_bar = round(W / factor) * factor  (Python round:
     half to even); if h_bar * w_bar > max_pixels: beta = sqrt(H * W / max_pixels),
     h_bar = max(factor, floor(H / beta / factor) * factor), same for w_bar; elif
     h_bar * w_bar < min_pixels: beta = sqrt(min_pixels / (H * W)),
     h_bar = ceil(H * beta / factor) * factor, same for w_bar. An aspect ratio
     max(H, W) / min(H, W) > 200 is refused. min_pixels = size["shortest_edge"] = 56 * 56,
     max_pixels = size["longest_edge"] = 28 * 28 * 1280 (the class defaults; Qwen2.5-VL's
     preprocessor_config.json raises max_pixels to 12845056). A 64x64 image becomes 56x56
     (round(64 / 28) = 2); 56x56, 112x84, ... are kept as they are.
2. resize (`resample=BICUBIC`): Pillow's `Image.resize((w_bar, h_bar), BICUBIC)` on the uint8
     image, giving uint8, exactly as HF's `image_transforms.resize` does (same size: a copy).
     HF's torchvision backend (`Qwen2VLImageProcessor` when torchvision is installed) resizes
     with torch's antialiased bicubic instead and differs from this by a few units of 1/255.
3. rescale (`rescale_factor = 1 / 255`): float64(x) * (1 / 255), then float32.
4. normalize (`image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD`): (x - mean) / std in
     float32, per channel.
5. patchify (`patch_size P = 14, temporal_patch_size T = 2, merge_size M = 2`): the (C, H, W)
     image, grid_h = H / P, grid_w = W / P, reshaped to (C, gh/M, M, P, gw/M, M, P), transposed
     to (gh/M, gw/M, M, M, C, P, P), repeated T times on a new axis before the first P (a still
     image is T identical frames), flattened to (gh * gw, C * T * P * P). Rows are patches in
     merge-window order (each M x M window of patches contiguous, windows row-major); columns
     are (channel, frame, row, col) row-major. grid_thw = (1, grid_h, grid_w).

A batch concatenates the images' patches in order: pixel_values (sum of t * h * w, C * T * P * P)
float32 and image_grid_thw (num_images, 3) int64. Each image then takes
t * h * w / merge_size^2 placeholder tokens (`image_token_count`, as
grpo_jax.models.vision.placeholders expands them).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.mrope import image_token_count

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200


@dataclasses.dataclass(frozen=True)
class VisionProcessorSpec:
  """The image processor's settings, named as HF's `Qwen2VLImageProcessor` names them, with its
  defaults (min_pixels is its size["shortest_edge"], max_pixels its size["longest_edge"])."""
  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  rescale_factor: float = 1 / 255
  image_mean: tuple = OPENAI_CLIP_MEAN
  image_std: tuple = OPENAI_CLIP_STD

  @property
  def factor(self) -> int:
    """The side every resized image is a multiple of: patch_size * merge_size."""
    return self.patch_size * self.merge_size


def smart_resize(height: int, width: int, *, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
  """(h_bar, w_bar): HF's smart_resize (module docstring, step 1): both multiples of factor,
  h_bar * w_bar within [min_pixels, max_pixels] where the rounding allows, aspect ratio kept as
  closely as possible. An aspect ratio over 200 is a ConfigError."""
  height, width = int(height), int(width)
  if min(height, width) <= 0 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
    raise ConfigError(f"an image of {height}x{width} pixels has an aspect ratio over "
                      f"{MAX_ASPECT_RATIO} (or an empty side); crop or pad it first.")
  h_bar = round(height / factor) * factor
  w_bar = round(width / factor) * factor
  if h_bar * w_bar > max_pixels:
    beta = math.sqrt((height * width) / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


def resize_bicubic(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """(height, width, 3) uint8: Pillow's BICUBIC resize of an (H, W, 3) uint8 image (HF's
  `image_transforms.resize` with `resample=BICUBIC`, so equal to it bit for bit); the same size
  returns a copy. Pillow, not NumPy: its per-axis passes are simple fixed-point convolutions, but
  Pillow 13 chooses which axis to resample first by a rule of its own, and the order changes the
  rounding of the uint8 intermediate by up to ~20/255."""
  if image.shape[:2] == (height, width):
    return image.copy()
  from PIL import Image  # Pillow comes with matplotlib; grpo_jax.data.images needs it too.
  return np.asarray(Image.fromarray(image).resize((width, height), resample=Image.BICUBIC))


def rescale_and_normalize(image: np.ndarray, rescale_factor: float, image_mean: Sequence[float],
                          image_std: Sequence[float]) -> np.ndarray:
  """(H, W, C) float32: float32(float64(x) * rescale_factor), then (x - mean) / std in float32
  per channel (HF's `rescale` then `normalize`, in their dtypes)."""
  scaled = (image.astype(np.float64) * rescale_factor).astype(np.float32)
  mean = np.asarray(image_mean, np.float32)
  std = np.asarray(image_std, np.float32)
  return (scaled - mean) / std


def patchify(image: np.ndarray, patch_size: int, merge_size: int,
             temporal_patch_size: int) -> tuple[np.ndarray, tuple[int, int, int]]:
  """(patches, grid_thw) of an (H, W, C) float image, H and W multiples of
  patch_size * merge_size: patches (gh * gw, C * T * P * P) float32 in HF's order (module
  docstring, step 5), grid_thw = (1, gh, gw)."""
  height, width, channels = image.shape
  grid_h, grid_w = height // patch_size, width // patch_size
  m, p = merge_size, patch_size
  blocks = np.asarray(image, np.float32).reshape(grid_h // m, m, p, grid_w // m, m, p, channels)
  blocks = blocks.transpose(0, 3, 1, 4, 6, 2, 5)  # (gh/M, gw/M, M, M, C, P, P)
  frames = np.broadcast_to(blocks[:, :, :, :, :, None],
                           blocks.shape[:5] + (temporal_patch_size,) + blocks.shape[5:])
  patches = frames.reshape(grid_h * grid_w, channels * temporal_patch_size * p * p)
  return np.ascontiguousarray(patches), (1, grid_h, grid_w)


def process_image(image, spec: VisionProcessorSpec = VisionProcessorSpec()
                  ) -> tuple[np.ndarray, tuple[int, int, int]]:
  """(patches, grid_thw) of one (H, W, 3) uint8 RGB image (what grpo_jax.data.images reads;
  anything else is a ConfigError): smart_resize, bicubic resize, rescale, normalize, patchify
  (module docstring)."""
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
    raise ConfigError(f"the vision processor takes (H, W, 3) uint8 RGB images, not "
                      f"{image.dtype} {image.shape}; read it with grpo_jax.data.images first.")
  height, width = smart_resize(image.shape[0], image.shape[1], factor=spec.factor,
                               min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)
  resized = resize_bicubic(image, height, width)
  normalized = rescale_and_normalize(resized, spec.rescale_factor, spec.image_mean,
                                     spec.image_std)
  return patchify(normalized, spec.patch_size, spec.merge_size, spec.temporal_patch_size)


def process_images(images: Sequence, spec: VisionProcessorSpec = VisionProcessorSpec()
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(pixel_values, image_grid_thw) of a list of (H, W, 3) uint8 RGB images, as HF's
  `Qwen2VLImageProcessor(images)` returns them: pixel_values (sum over images of t * h * w,
  C * T * P * P) float32, the images' patches in order; image_grid_thw (num_images, 3) int64."""
  if len(images) == 0:
    raise ConfigError("process_images got no images; pass at least one (H, W, 3) uint8 image.")
  processed = [process_image(image, spec) for image in images]
  pixel_values = np.concatenate([patches for patches, _ in processed], axis=0)
  image_grid_thw = np.asarray([grid for _, grid in processed], np.int64).reshape(-1, 3)
  return pixel_values, image_grid_thw


def image_token_counts(image_grid_thw, merge_size: int = 2) -> list[int]:
  """The placeholder tokens of each image: t * h * w / merge_size^2 (what
  grpo_jax.models.vision.placeholders.expand_image_placeholders repeats `<|image_pad|>` by)."""
  grids = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
  return [image_token_count(grid, merge_size) for grid in grids]
