"""grpo_jax.data.vision_processor against transformers 5's Qwen2VLImageProcessor (its Pillow
backend, what `Qwen2VLImageProcessor` is without torchvision): image_grid_thw identical,
pixel_values equal (measured max |diff| 0.0 with or without a resize; asserted <= 1e-6), and
each image's placeholder count t * h * w / merge_size^2."""

import numpy as np
import pytest

from grpo_jax.data import vision_processor as vp
from grpo_jax.data.visual_count import make_row
from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.placeholders import expand_image_placeholders

hf_module = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

TOLERANCE = 1e-6  # measured: 0.0 for every size below (the same Pillow resize, the same dtypes)
IMAGE_PAD = 151655  # Qwen2.5-VL's <|image_pad|>


def _random_image(height, width, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _hf(images, **kwargs):
  out = hf_module.Qwen2VLImageProcessorPil(**kwargs)(images=list(images), return_tensors="np")
  return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


@pytest.mark.parametrize("height,width,grid", [
    (56, 56, (1, 4, 4)),      # already a multiple of 28: no resize
    (64, 64, (1, 4, 4)),      # round(64 / 28) = 2: resized to 56x56
    (100, 150, (1, 8, 10)),   # resized to 112x140
    (20, 30, (1, 4, 6)),      # under min_pixels: scaled up to 56x84
])
def test_one_image_equals_hf(height, width, grid):
  image = _random_image(height, width)
  pixel_values, grid_thw = vp.process_images([image])
  hf_pixels, hf_grid = _hf([image])
  np.testing.assert_array_equal(grid_thw, hf_grid)
  assert tuple(grid_thw[0]) == grid
  assert pixel_values.dtype == np.float32 and pixel_values.shape == hf_pixels.shape
  assert pixel_values.shape == (grid[1] * grid[2], 3 * 2 * 14 * 14)
  assert np.abs(pixel_values - hf_pixels).max() <= TOLERANCE


def test_batch_and_max_pixels_equal_hf():
  """Three sizes in one call, with a max_pixels that forces a downscale of the largest."""
  images = [_random_image(56, 56, 1), _random_image(90, 61, 2), _random_image(300, 400, 3)]
  spec = vp.VisionProcessorSpec(max_pixels=28 * 28 * 20)
  pixel_values, grid_thw = vp.process_images(images, spec)
  hf_pixels, hf_grid = _hf(images, max_pixels=28 * 28 * 20)
  np.testing.assert_array_equal(grid_thw, hf_grid)
  assert grid_thw.dtype == np.int64 and grid_thw.shape == (3, 3)
  assert int(grid_thw[2, 1] * grid_thw[2, 2]) * 14 * 14 <= 28 * 28 * 20
  assert np.abs(pixel_values - hf_pixels).max() <= TOLERANCE


def test_smart_resize_equals_hf():
  for height in (1, 13, 28, 41, 56, 64, 99, 500, 3000):
    for width in (7, 28, 42, 64, 250, 1000):
      for max_pixels in (28 * 28 * 16, 28 * 28 * 1280):
        if max(height, width) / min(height, width) > 200:
          continue
        ours = vp.smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=max_pixels)
        assert ours == hf_module.smart_resize(height, width, factor=28, min_pixels=56 * 56,
                                              max_pixels=max_pixels), (height, width, max_pixels)


def test_patch_order():
  """Row r of pixel_values is patch (gh, gw) of the merge-window order; its columns are
  (channel, frame, y, x), both frames the same image."""
  values = np.arange(56 * 56 * 3, dtype=np.float32).reshape(56, 56, 3)
  patches, grid = vp.patchify(values, patch_size=14, merge_size=2, temporal_patch_size=2)
  assert grid == (1, 4, 4) and patches.shape == (16, 1176)
  # window (0, 1) holds patches (0, 2), (0, 3), (1, 2), (1, 3) as rows 4..7
  for row, (ph, pw) in zip(range(4, 8), [(0, 2), (0, 3), (1, 2), (1, 3)]):
    patch = patches[row].reshape(3, 2, 14, 14)
    expected = values[ph * 14:(ph + 1) * 14, pw * 14:(pw + 1) * 14].transpose(2, 0, 1)
    np.testing.assert_array_equal(patch[:, 0], expected)
    np.testing.assert_array_equal(patch[:, 1], expected)


def test_token_counts_match_placeholder_expansion():
  """A visual_count image (64x64) and two others: t * h * w / 4 image tokens each, the counts
  expand_image_placeholders gives the prompt."""
  images = [make_row(0, 0).image, _random_image(100, 150), _random_image(56, 56)]
  pixel_values, grid_thw = vp.process_images(images)
  counts = vp.image_token_counts(grid_thw, merge_size=2)
  assert counts == [4, 20, 4]
  assert sum(counts) * 4 == pixel_values.shape[0]
  row = [1, IMAGE_PAD, 2, IMAGE_PAD, 3, IMAGE_PAD, 4]
  expanded = expand_image_placeholders([row], grid_thw, image_token_id=IMAGE_PAD, merge_size=2)
  assert int((expanded[0] == IMAGE_PAD).sum()) == sum(counts)


def test_bad_inputs_are_config_errors():
  with pytest.raises(ConfigError, match="uint8"):
    vp.process_images([np.zeros((56, 56, 3), np.float32)])
  with pytest.raises(ConfigError, match="aspect ratio"):
    vp.smart_resize(10, 2500)
  with pytest.raises(ConfigError, match="no images"):
    vp.process_images([])
