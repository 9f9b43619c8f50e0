"""Images of any grid through the sampler and the loss (grpo_jax/rollout/vlm_sampler.py: the
static engine and the teacher-forced pass on the prompts' inputs) on a tiny random float32
Qwen2.5-VL: its log-probs against the teacher-forced pass, an image swap reaching both, and
draws that do not depend on the batch. (Greedy cached decoding against transformers' generate:
tests/test_qwen2_5_vl_model.py.)"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.placeholders import expand_image_placeholders
from grpo_jax.models.vision.qwen2_5_vl_model import init_vlm_params
from grpo_jax.models.vision.qwen2_5_vl_model_hf import vlm_config_from_hf
from grpo_jax.models.scoring import completion_scores, token_logprobs_and_entropy
from grpo_jax.rollout.vlm_sampler import host_prompt_inputs, vlm_sample
from grpo_jax.rollout.sampling import choose_tokens

IMAGE, START, END, EOS = 290, 292, 293, 2
TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
            bos_token_id=1, eos_token_id=EOS, pad_token_id=0, hidden_act="silu",
            rms_norm_eps=1e-6)
VISION = dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, window_size=16, out_hidden_size=64,
              fullatt_block_indexes=[1])
GRIDS = {"small": (1, 4, 4), "wide": (1, 4, 6)}  # 16 / 24 patches, 4 / 6 image tokens


def vlm_completion_logprobs(params, ids, mask, pixels, grid, tokens, live, cfg, *,
                            temperature=1.0, group_size=1):
  """The update's log-probs of the sampled tokens: models/scoring.completion_scores with the
  prompts' inputs (rollout/vlm_sampler.host_prompt_inputs), 0 where live is False."""
  ids, mask, inputs = host_prompt_inputs(params, ids, mask, pixels, grid, cfg, group_size)
  return _scores(params["text"], jnp.asarray(ids), jnp.asarray(mask),
                 jnp.asarray(tokens, jnp.int32), jnp.asarray(live, bool), inputs, cfg=cfg.text,
                 temperature=float(temperature))


@functools.partial(jax.jit, static_argnames=("cfg", "temperature"))
def _scores(text_params, ids, mask, tokens, live, inputs, *, cfg, temperature):
  seqs = types.SimpleNamespace(prompt_tokens=ids, prompt_mask=mask, completion_tokens=tokens,
                               completion_mask=live)
  return jnp.where(live, completion_scores(text_params, cfg, seqs, temperature,
                                           inputs=inputs)[0], 0.0)
NEW = 8  # completion tokens; the tests share shapes, so that they share compiled programs


@pytest.fixture(scope="module")
def model():
  """(cfg, params) of a tiny random Qwen2.5-VL: init_vlm_params's shapes (jax.eval_shape, no
  compiled init), every weight N(0, 0.1^2), norm weights 1 + N(0, 0.1^2)."""
  cfg = vlm_config_from_hf(dict(text_config=TEXT, vision_config=VISION, image_token_id=IMAGE,
                                tie_word_embeddings=False))
  shapes = jax.eval_shape(functools.partial(init_vlm_params, cfg), jax.random.key(0))
  rng = np.random.RandomState(0)

  def fill(path, x):
    norm = any("norm" in str(p) or "ln_q" in str(p) for p in path)
    return jnp.asarray(float(norm) + 0.1 * rng.randn(*x.shape), x.dtype)
  return cfg, jax.tree_util.tree_map_with_path(fill, shapes)


def prompts(grids, seed=0, texts=((3, 4), (2, 2), (4, 1))):
  """Left-padded (input_ids, attention_mask, pixel_values, image_grid_thw): prompt i is
  text + one image of grids[i] + text, random pixels (seed)."""
  rng = np.random.RandomState(1)
  rows = [list(rng.randint(3, 280, a)) + [START, IMAGE, END] + list(rng.randint(3, 280, b))
          for (a, b), _ in zip(texts, grids)]
  grid_thw = np.array(grids, np.int64)
  pixels = np.random.RandomState(seed).randn(int(grid_thw.prod(-1).sum()), 96).astype(np.float32)
  rows = expand_image_placeholders(rows, grid_thw, image_token_id=IMAGE)
  width = max(len(r) for r in rows)
  ids, mask = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width), np.int64)
  for i, row in enumerate(rows):
    ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
  return ids, mask, pixels, grid_thw


def test_sampler_logprobs_equal_teacher_forced(model):
  """G = 2 samples per prompt at temperature 1, stopping at EOS: the sampler's log-probs equal
  the update's teacher-forced ones on the same rows (1e-5)."""
  cfg, params = model
  batch = prompts([GRIDS["small"], GRIDS["wide"]])
  first, _, _ = vlm_sample(params, *batch, jax.random.key(3), cfg, NEW, 1.0, 2)
  eos = int(first[0, 3])  # a token row 0 draws: it ends there (the same key, the same draws)
  tokens, logp, live = vlm_sample(params, *batch, jax.random.key(3), cfg, NEW, 1.0, 2,
                                  eos_id=eos)
  assert tokens.shape == logp.shape == live.shape == (4, NEW)
  np.testing.assert_array_equal(np.asarray(tokens[0, :4]), np.asarray(first[0, :4]))
  assert np.asarray(live[0, :4]).all() and not np.asarray(live[0, 4:]).any()
  assert (np.asarray(tokens[0, 4:]) == 0).all() and (np.asarray(logp[0, 4:]) == 0).all()
  update = vlm_completion_logprobs(params, *batch, tokens, live, cfg, temperature=1.0,
                                   group_size=2)
  np.testing.assert_allclose(np.asarray(logp), np.asarray(update), atol=1e-5, rtol=0)


def test_swapping_an_image_reaches_sampler_and_update(model):
  """Prompt 1's image replaced by another of the same size: its rows' log-probs change in the
  sampler and in the teacher-forced pass; prompt 0's rows do not."""
  cfg, params = model
  key = jax.random.key(5)
  ids, mask, pixels, grid = prompts([GRIDS["small"], GRIDS["wide"]])
  swapped = pixels.copy()
  swapped[16:] = np.random.RandomState(9).randn(24, 96)  # prompt 1's 24 patches
  ours = [vlm_sample(params, ids, mask, p, grid, key, cfg, NEW, 1.0, 2)
          for p in (pixels, swapped)]
  (tokens, logp, live), (_, logp_swapped, _) = ours
  np.testing.assert_allclose(np.asarray(logp[:2]), np.asarray(logp_swapped[:2]), atol=1e-6)
  assert np.abs(np.asarray(logp[2:]) - np.asarray(logp_swapped[2:])).max() > 1e-3
  update = [vlm_completion_logprobs(params, ids, mask, p, grid, tokens, live, cfg, group_size=2)
            for p in (pixels, swapped)]
  np.testing.assert_allclose(np.asarray(update[0][:2]), np.asarray(update[1][:2]), atol=1e-6)
  assert np.abs(np.asarray(update[0][2:]) - np.asarray(update[1][2:])).max() > 1e-3


def test_draws_do_not_depend_on_the_batch(model):
  """The same key: prompt 1 beside a longer prompt (left-padded, G = 2 rows sharing its
  prefill) or without it (unpadded, given twice with G = 1, so each row has a prefill of its
  own; its rows' draws named by row_ids, as rows 2 and 3 of the pair) draws the same tokens
  and log-probs."""
  cfg, params = model
  key = jax.random.key(7)
  ids, mask, pixels, grid = prompts([GRIDS["small"], GRIDS["wide"]])
  pad = int((mask[1] == 0).sum())
  assert pad > 0
  tokens, logp, live = vlm_sample(params, ids, mask, pixels, grid, key, cfg, NEW, 1.0, 2,
                                  eos_id=EOS)
  twice = np.array([1, 1])
  alone = vlm_sample(params, ids[twice, pad:], mask[twice, pad:], np.tile(pixels[16:], (2, 1)),
                     grid[twice], key, cfg, NEW, 1.0, 1, eos_id=EOS, row_ids=[2, 3])
  np.testing.assert_array_equal(np.asarray(tokens[2:]), np.asarray(alone[0]))
  np.testing.assert_array_equal(np.asarray(live[2:]), np.asarray(alone[2]))
  np.testing.assert_allclose(np.asarray(logp[2:]), np.asarray(alone[1]), atol=1e-5, rtol=0)


def test_bad_settings_are_one_sentence(model):
  cfg, params = model
  batch = prompts([GRIDS["small"], GRIDS["wide"]])
  with pytest.raises(ConfigError, match="group_size=0"):
    vlm_sample(params, *batch, jax.random.key(0), cfg, NEW, 1.0, 0)
  with pytest.raises(ConfigError, match="row_ids"):
    vlm_sample(params, *batch, jax.random.key(0), cfg, NEW, 1.0, 2, row_ids=[0, 1])


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.5])
def test_token_logprobs_are_the_text_samplers(temperature):
  """The update's log pi under softmax(logits / T) (scoring.token_logprobs_and_entropy, what
  the VLM's teacher-forced pass scores with) is the one the text sampler records."""
  logits = jax.random.normal(jax.random.key(0), (5, 300)) * 3
  uniform = jax.random.uniform(jax.random.key(1), (5,))
  tokens, logp, _ = choose_tokens(logits, uniform, temperature, 0, 1.0)
  scored, _ = token_logprobs_and_entropy(logits, tokens, temperature)
  np.testing.assert_allclose(np.asarray(scored), np.asarray(logp), atol=1e-6, rtol=0)
