"""Qwen2.5-VL's vision encoder (grpo_jax/models/vision/qwen2_5_vl.py) against transformers'
Qwen2_5_VisionTransformerPretrainedModel on the same tiny random weights."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (  # noqa: E402
    Qwen2_5_VLVisionConfig)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (  # noqa: E402
    Qwen2_5_VisionTransformerPretrainedModel)

from grpo_jax.errors import ConfigError, InputError  # noqa: E402
from grpo_jax.models.vision.qwen2_5_vl import (encode_images, init_vision_params,  # noqa: E402
                                               vision_config_from_hf, vision_param_axes)
from grpo_jax.models.vision.qwen2_5_vl_hf import (vision_params_from_hf,  # noqa: E402
                                                  vision_params_to_hf)
from grpo_jax.models.vision.qwen2_5_vl_layout import patch_layout  # noqa: E402

# window_size 16 = 2 merged units of 2x2 patches of 4 px: the 6x8-patch image's 3x4 units fall
# in 4 windows of unequal sizes, so the window order differs from the processor's.
TINY = dict(depth=4, hidden_size=32, intermediate_size=40, num_heads=2, patch_size=4,
            temporal_patch_size=2, spatial_merge_size=2, window_size=16, out_hidden_size=48,
            fullatt_block_indexes=[1])


@pytest.fixture(scope="module")
def hf_vision():
  """(HF encoder, our config, our params loaded from its state dict under model.visual.)."""
  torch.manual_seed(0)
  hf_cfg = Qwen2_5_VLVisionConfig(**TINY)
  hf_cfg._attn_implementation = "eager"
  model = Qwen2_5_VisionTransformerPretrainedModel(hf_cfg).eval()
  with torch.no_grad():  # HF initialises norms to 1 and biases to 0: make every weight count
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  state = {"model.visual." + k: v.numpy() for k, v in model.state_dict().items()}
  cfg = vision_config_from_hf({"vision_config": hf_cfg.to_dict()})
  return model, cfg, vision_params_from_hf(state, cfg)


def processed(sizes):
  """HF image processor output (pixel_values, image_grid_thw) for random RGB images."""
  from transformers import Qwen2VLImageProcessorPil
  processor = Qwen2VLImageProcessorPil(
      patch_size=4, merge_size=2, temporal_patch_size=2,
      size={"shortest_edge": 64, "longest_edge": 100_000})
  rng = np.random.RandomState(0)
  images = [rng.randint(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
  out = processor(images=images, return_tensors="np")
  return out["pixel_values"], out["image_grid_thw"]


def hf_tokens(model, pixel_values, grid_thw):
  with torch.no_grad():
    return model(torch.from_numpy(pixel_values), grid_thw=torch.from_numpy(grid_thw)
                 ).pooler_output.numpy()


@pytest.mark.parametrize("sizes, grid", [
    ([(16, 16)], [[1, 4, 4]]),
    ([(16, 16), (24, 32)], [[1, 4, 4], [1, 6, 8]]),
])
def test_encoder_matches_transformers(hf_vision, sizes, grid):
  model, cfg, params = hf_vision
  pixel_values, grid_thw = processed(sizes)
  np.testing.assert_array_equal(grid_thw, grid)
  ours = np.asarray(encode_images(params, pixel_values, grid_thw, cfg))
  assert ours.shape == (grid_thw.prod(-1).sum() // 4, 48)
  np.testing.assert_allclose(ours, hf_tokens(model, pixel_values, grid_thw), atol=1e-4,
                             rtol=0)


def test_two_frames_and_odd_windows_match_transformers(hf_vision):
  """A two-frame grid (full attention within each frame) beside a 10x6-patch image (5x3
  units: windows of 4, 2 and 1 units), from pixel_values of the documented shape."""
  model, cfg, params = hf_vision
  grid_thw = np.array([[2, 4, 4], [1, 10, 6]])
  pixel_values = np.random.RandomState(1).randn(92, cfg.patch_dim).astype(np.float32)
  ours = np.asarray(encode_images(params, pixel_values, grid_thw, cfg))
  np.testing.assert_allclose(ours, hf_tokens(model, pixel_values, grid_thw), atol=1e-4,
                             rtol=0)


def test_window_order_is_transformers(hf_vision):
  """The reordering is real here (not the identity) and equals HF's get_vision_window_index."""
  from transformers.vision_utils import get_vision_window_index
  _, cfg, _ = hf_vision
  grid = np.array([[1, 4, 4], [1, 6, 8], [2, 10, 6]])
  layout = patch_layout(grid, 2, cfg.window_units)
  index, cu = get_vision_window_index(torch.from_numpy(grid), 2, 16, 4)
  np.testing.assert_array_equal(layout.window_index, index.numpy())
  assert (layout.window_index != np.arange(len(layout.window_index))).any()
  boundaries = np.flatnonzero(np.diff(layout.window_segments)) + 1
  np.testing.assert_array_equal(np.concatenate([[0], boundaries, [len(layout.positions)]]),
                                cu.numpy())


def test_params_round_trip_and_axes(hf_vision):
  model, cfg, params = hf_vision
  exported = vision_params_to_hf(params, cfg, prefix="")
  state = model.state_dict()
  assert exported.keys() == state.keys()
  for name, array in exported.items():
    np.testing.assert_array_equal(array, state[name].numpy(), err_msg=name)
  axes = vision_param_axes(cfg)
  assert axes["blocks"]["attn"]["qkv"]["kernel"] == ("layers", "embed", None, "heads",
                                                     "head_dim")
  assert axes["merger"]["mlp_2"]["kernel"] == ("mlp", "embed")
  import jax  # noqa: PLC0415
  shapes = jax.eval_shape(lambda k: init_vision_params(cfg, k), jax.random.key(0))
  assert jax.tree.map(np.shape, shapes) == jax.tree.map(np.shape, params)


def test_bad_inputs_are_one_sentence(hf_vision):
  _, cfg, params = hf_vision
  with pytest.raises(ConfigError, match=r"image_grid_thw\[0\] = \(1, 3, 4\)"):
    encode_images(params, np.zeros((12, cfg.patch_dim)), np.array([[1, 3, 4]]), cfg)
  with pytest.raises(ConfigError, match="pixel_values has shape"):
    encode_images(params, np.zeros((15, cfg.patch_dim)), np.array([[1, 4, 4]]), cfg)
  with pytest.raises(InputError, match="lacks visual.merger.mlp.2.bias"):
    state = vision_params_to_hf(params, cfg, prefix="visual.")
    del state["visual.merger.mlp.2.bias"]
    vision_params_from_hf(state, cfg)
  with pytest.raises(ConfigError, match="window_size=4"):
    vision_config_from_hf({**TINY, "window_size": 4})


def dense_masked_attention(q, k, v, blocks):
  """The reference: softmax over all N keys with a (N, N) same-segment mask (the segment ids
  rebuilt from the blocks), as the encoder computed it before attention was blocked."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  groups, _ = blocks
  ids, first = [], 0
  for index in groups:
    ids.append(jnp.repeat(first + jnp.arange(index.shape[0]), index.shape[1]))
    first += index.shape[0]
  segment = jnp.zeros(q.shape[0], jnp.int32).at[
      jnp.concatenate([g.reshape(-1) for g in groups])].set(jnp.concatenate(ids))
  mask = segment[:, None] == segment[None, :]
  scores = jnp.einsum("qhd,khd->hqk", q, k).astype(jnp.float32) / np.sqrt(q.shape[-1])
  scores = jnp.where(mask[None], scores, jnp.finfo(jnp.float32).min)
  return jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1).astype(v.dtype), v)


def test_blocked_attention_equals_dense_masked(hf_vision, monkeypatch):
  """Two images of different sizes (4x4 and 10x6 patches: windows of 4, 2 and 1 units) and a
  two-frame grid: per-segment attention equals the dense masked form within 1e-6, for frames
  and windows, in values and gradients, and through the whole encoder."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from grpo_jax.models.vision import qwen2_5_vl  # noqa: PLC0415
  _, cfg, params = hf_vision
  grid_thw = np.array([[1, 4, 4], [1, 10, 6], [2, 4, 4]])
  layout = qwen2_5_vl._layout_arrays(grid_thw, cfg)
  frames, windows = layout[3], layout[4]
  assert len(windows[0]) == 3 and len(frames[0]) == 2  # window lengths 4, 8, 16; frames 16, 60
  q, k, v = jax.random.normal(jax.random.key(0), (3, 108, 2, 16))

  def values_and_grads(attention, q, k, v, blocks):
    loss = lambda q, k, v: jnp.sum(jnp.sin(attention(q, k, v, blocks)))  # noqa: E731
    return attention(q, k, v, blocks), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  both = jax.jit(lambda q, k, v, layouts: [
      (values_and_grads(qwen2_5_vl.segment_attention, q, k, v, blocks),
       values_and_grads(dense_masked_attention, q, k, v, blocks)) for blocks in layouts])
  for ours, dense in both(q, k, v, (frames, windows)):
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(dense)):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  pixel_values = np.random.RandomState(2).randn(108, cfg.patch_dim).astype(np.float32)
  encode = lambda: jax.jit(lambda *args: qwen2_5_vl.VisionEncoder(cfg).apply(  # noqa: E731
      {"params": params}, *args))(pixel_values, *layout)  # a new function: traced anew
  ours = encode()
  traced = []
  monkeypatch.setattr(qwen2_5_vl, "segment_attention",
                      lambda *args: traced.append(1) or dense_masked_attention(*args))
  jax.clear_caches()  # jax.checkpoint caches its trace: retrace with the reference
  reference = encode()
  assert traced  # the reference really ran
  # 1 ulp apart at 2.52 on an AMD EPYC (2026-12-05): float32 rounding, not a layout error.
  np.testing.assert_allclose(ours, reference, atol=1e-6, rtol=1e-6)
  jax.clear_caches()  # and drop the reference's traces for the tests that follow
