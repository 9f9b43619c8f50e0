"""The whole Qwen2.5-VL forward pass (grpo_jax/models/vision/qwen2_5_vl_model.py) against
transformers' Qwen2_5_VLForConditionalGeneration on the same tiny random weights: logits on a
left-padded batch of image + text prompts (different image sizes, two images in a row, a
text-only row), and greedy generation."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # noqa: E402

from grpo_jax.errors import ConfigError, InputError  # noqa: E402
from grpo_jax.models.vision.placeholders import expand_image_placeholders  # noqa: E402
from grpo_jax.models.vision.qwen2_5_vl_model import VlmConfig, vlm_logits  # noqa: E402
from grpo_jax.models.vision.qwen2_5_vl_model_hf import (  # noqa: E402
    text_params_from_hf, vlm_config_from_hf, vlm_params_from_hf)

IMAGE, VIDEO, START, END = 290, 291, 292, 293
TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
VISION = dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, window_size=16, out_hidden_size=64,
              fullatt_block_indexes=[1])
SIZES = [(16, 16), (24, 32), (16, 24)]  # pixels: grids (1, 4, 4), (1, 6, 8), (1, 4, 6)


@pytest.fixture(scope="module")
def models():
  """(HF model, our config, our params loaded from its state dict)."""
  torch.manual_seed(0)
  hf_cfg = Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION, image_token_id=IMAGE,
                            video_token_id=VIDEO, vision_start_token_id=START,
                            vision_end_token_id=END, tie_word_embeddings=False)
  hf_cfg._attn_implementation = "eager"
  model = Qwen2_5_VLForConditionalGeneration(hf_cfg).eval()
  with torch.no_grad():  # HF initialises norms to 1 and biases to 0: make every weight count
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  cfg = vlm_config_from_hf(hf_cfg.to_dict())
  return model, cfg, vlm_params_from_hf(state, cfg)


def images(sizes):
  """The HF image processor's (pixel_values, image_grid_thw) of random RGB images."""
  from transformers import Qwen2VLImageProcessorPil
  processor = Qwen2VLImageProcessorPil(
      patch_size=4, merge_size=2, temporal_patch_size=2,
      size={"shortest_edge": 64, "longest_edge": 100_000})
  rng = np.random.RandomState(0)
  out = processor(images=[rng.randint(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes],
                  return_tensors="np")
  return out["pixel_values"], out["image_grid_thw"]


def batch():
  """Left-padded (input_ids, attention_mask, pixel_values, image_grid_thw): a 16x16 image, a
  24x32 image, two images (16x16 then 16x24) and a text-only row."""
  rng = np.random.RandomState(1)
  text = lambda n: list(rng.randint(3, 280, n))  # noqa: E731
  image = [START, IMAGE, END]
  rows = [text(3) + image + text(4), text(2) + image + text(2),
          text(2) + image + text(1) + image + text(3), text(6)]
  pixel_values, grid_thw = images([SIZES[0], SIZES[1], SIZES[0], SIZES[2]])
  rows = expand_image_placeholders(rows, grid_thw, image_token_id=IMAGE)
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int64)
  mask = np.zeros((len(rows), width), np.int64)
  for i, row in enumerate(rows):
    ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
  return ids, mask, pixel_values, grid_thw


def hf_inputs(ids, mask, pixel_values, grid_thw):
  """HF's model inputs, with the processor's mm_token_type_ids (1 at image tokens), without
  which transformers 5 does not build the 3-D positions."""
  return dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
              mm_token_type_ids=torch.from_numpy((ids == IMAGE).astype(np.int64)),
              pixel_values=torch.from_numpy(pixel_values),
              image_grid_thw=torch.from_numpy(grid_thw))


def test_logits_match_transformers(models):
  model, cfg, params = models
  ids, mask, pixel_values, grid_thw = batch()
  ours = np.asarray(vlm_logits(params, ids, mask, pixel_values, grid_thw, cfg))
  with torch.no_grad():
    theirs = model(**hf_inputs(ids, mask, pixel_values, grid_thw)).logits.numpy()
  assert ours.shape == theirs.shape == (*ids.shape, 300)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)


def test_text_only_batch_matches_transformers(models):
  """No images at all: pixel_values and image_grid_thw None (plain RoPE positions)."""
  model, cfg, params = models
  ids, mask = np.array([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]), np.array(
      [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
  ours = np.asarray(vlm_logits(params, ids, mask, None, None, cfg))
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
                   ).logits.numpy()
  np.testing.assert_allclose(ours[mask > 0], theirs[mask > 0], atol=1e-4, rtol=0)


def test_greedy_tokens_match_transformers_generate(models):
  """32 greedy tokens of the KV-cached sampler (the text engines on the prompts' inputs, one
  row per prompt) equal transformers' generate."""
  import jax  # noqa: PLC0415
  from grpo_jax.rollout.vlm_sampler import vlm_sample  # noqa: PLC0415
  model, cfg, params = models
  ids, mask, pixel_values, grid_thw = batch()
  cached, _, _ = vlm_sample(params, ids, mask, pixel_values, grid_thw, jax.random.key(0), cfg,
                            max_new_tokens=32, temperature=0.0)
  with torch.no_grad():
    out = model.generate(**hf_inputs(ids, mask, pixel_values, grid_thw), max_new_tokens=32,
                         min_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
  np.testing.assert_array_equal(np.asarray(cached), out[:, ids.shape[1]:].numpy())


def test_bad_inputs_are_one_sentence(models):
  _, cfg, params = models
  ids, mask, pixel_values, grid_thw = batch()
  with pytest.raises(ConfigError, match="image_grid_thw"):
    vlm_logits(params, ids, mask, pixel_values, grid_thw[:3], cfg)
  with pytest.raises(ConfigError, match="mrope_section"):
    VlmConfig(cfg.text, cfg.vision, (2, 3, 4))
  with pytest.raises(InputError, match="language_model"):
    text_params_from_hf({"model.visual.patch_embed.proj.weight": 0}, cfg)


def test_remat_and_logits_chunk_keep_logprobs_and_gradients(models):
  """cfg.text.remat and cfg.text.logits_chunk change memory, not maths: the update's log-probs
  (vlm_completion_logprobs, completion positions only) within 1e-6 and the text decoder's
  gradients of the token-mean sum(A * logp) / tokens within 1e-5 of the plain pass (no remat,
  one piece)."""
  import dataclasses

  import jax
  import jax.numpy as jnp
  from tests.test_qwen2_5_vl_sampler import vlm_completion_logprobs
  _, cfg, params = models
  ids, mask, pixel_values, grid_thw = batch()
  rng = np.random.RandomState(2)
  completion = rng.randint(3, 280, (len(ids), 5))
  live = np.ones(completion.shape, bool)
  live[1, 3:] = False
  # advantages over the token count: the token-mean loss's scale (float32 rounding of a sum
  # of log-probs is ~3e-6 relative; at this scale every gradient is below 1)
  weights = jnp.asarray(rng.randn(*completion.shape) / live.sum(), jnp.float32)

  def scores(text_params, vlm_cfg):
    logp = vlm_completion_logprobs({"vision": params["vision"], "text": text_params}, ids, mask,
                                   pixel_values, grid_thw, completion, live, vlm_cfg,
                                   temperature=0.7)
    return jnp.sum(weights * logp), logp

  with_memory = lambda remat, chunk: dataclasses.replace(  # noqa: E731
      cfg, text=dataclasses.replace(cfg.text, remat=remat, logits_chunk=chunk))
  grad = jax.value_and_grad(scores, has_aux=True)
  (_, want), want_grad = grad(params["text"], with_memory("none", 0))
  for remat, chunk in (("full", 2), ("save_dots", 3)):
    (_, got), got_grad = grad(params["text"], with_memory(remat, chunk))
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0, err_msg=f"{remat} {chunk}")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), got_grad,
                 want_grad)
  with pytest.raises(ConfigError, match="remat"):
    with_memory("everything", 0)
