"""A vision-language policy in the RL loop (issue 57, "the image reaches every pass"): the
in-jit mRoPE ids equal the host rule (HF's get_rope_index), the sampler's log-probs equal the
update's on the same rows, another image changes both, the tower freezes by its switch, and the
recipe's refusals are one sentence each."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.build import check_vision_config
from grpo_jax.models.vision.mrope import mrope_position_ids
from grpo_jax.rollout.vlm_policy import fixed_grid_positions, image_tokens
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.learner.forward import policy_and_values
from grpo_jax.train.run.sections import ModelSection
from grpo_jax.train.run.setup import build_model, build_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recipe(**task):
  spec = importlib.util.spec_from_file_location(
      "grpo_vision_tiny", os.path.join(ROOT, "configs", "grpo_vision_tiny.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.task.update(task)
  return config


@pytest.fixture(scope="module")
def policy():
  config = recipe()
  task = build_task(config)
  cfg, params = build_model(ModelSection.of(config), jax.random.key(3), task)
  return config, task, cfg, params


def test_task_prompts_hold_one_image_run_of_the_grid(policy):
  _, task, cfg, _ = policy
  batch = task.train_batch(0, 4, seed=0)
  counts = (batch.prompt_tokens == cfg.image_token_id).sum(1)
  assert cfg.image_grid == (1, 8, 8) and image_tokens(cfg) == 16
  np.testing.assert_array_equal(counts, 16)
  assert batch.pixel_values.shape == (4, 64, cfg.vision.patch_dim)


def test_image_token_ids_decode_to_no_text(policy):
  """A sampled image token (or any id of the model's vocabulary) decodes without error."""
  _, task, cfg, _ = policy
  tok = task.tokenizer
  ids = np.array([[tok.encode("L")[0], tok.vision_start_id, tok.image_token_id,
                   tok.vision_end_id, cfg.text.vocab_size - 1]])
  assert task.decode(ids, np.ones(ids.shape, bool)) == ["L"]


def test_in_jit_positions_equal_the_host_rule(policy):
  """Left-padded rows with the image at different offsets, and a row without an image."""
  _, task, cfg, _ = policy
  batch = task.train_batch(0, 3, seed=0)
  ids, mask = batch.prompt_tokens.copy(), batch.prompt_mask.copy()
  # Row 1: two more pad columns (a shorter prompt); row 2: text only.
  ids[1, :2], mask[1, :2] = 0, False
  ids[2] = np.where(ids[2] == cfg.image_token_id, 5, ids[2])
  grids = np.tile(np.asarray(cfg.image_grid), (2, 1))
  want, deltas = mrope_position_ids(ids, grids, mask, image_token_id=cfg.image_token_id,
                                    merge_size=cfg.vision.spatial_merge_size)
  got, got_deltas = jax.jit(lambda i, m: fixed_grid_positions(i, m, cfg))(ids, mask)
  np.testing.assert_array_equal(np.asarray(got), want)
  np.testing.assert_array_equal(np.asarray(got_deltas), deltas[:, 0])


def sample(params, cfg, task, batch, key, temperature=1.0, group=4):
  sampling = Sampling(cfg, 3, task.eos_id, task.pad_id, temperature, group_size=group)
  return sampling.with_stats(params, batch.prompt_tokens, batch.prompt_mask, key,
                             images=batch.pixel_values)[0]


def update_logprobs(params, cfg, rollout, temperature=1.0):
  return policy_and_values(params, None, rollout, cfg, "none", temperature)[0]


def test_sampler_logprobs_equal_the_updates_and_the_image_matters(policy):
  _, task, cfg, params = policy
  batch = task.train_batch(0, 3, seed=0)
  rollout = sample(params, cfg, task, batch, jax.random.key(0), temperature=1.3)
  assert rollout.images.shape == (12,) + batch.pixel_values.shape[1:]
  mask = np.asarray(rollout.completion_mask)
  assert mask.sum() > 12
  update = np.asarray(update_logprobs(params, cfg, rollout, 1.3))
  np.testing.assert_allclose(update[mask], np.asarray(rollout.logprobs)[mask], atol=1e-5)
  # Another image under the same tokens: the update's log-probs move ...
  other = task.train_batch(50, 3, seed=0).pixel_values
  swapped = rollout._replace(images=jnp.repeat(jnp.asarray(other), 4, axis=0))
  moved = np.abs(np.asarray(update_logprobs(params, cfg, swapped, 1.3)) - update)[mask]
  assert moved.max() > 1e-4
  # ... and so do the sampler's, on the same key.
  batch.pixel_values = other
  again = sample(params, cfg, task, batch, jax.random.key(0), temperature=1.3)
  first = np.asarray(again.logprobs)[:, 0] - np.asarray(rollout.logprobs)[:, 0]
  changed_token = np.asarray(again.completion_tokens)[:, 0] != np.asarray(
      rollout.completion_tokens)[:, 0]
  assert changed_token.any() or np.abs(first).max() > 1e-4


def test_chunked_update_logprobs_equal_the_samplers(policy):
  """model.logits_chunk > 0 projects the completion a chunk at a time, as the sampler does."""
  import dataclasses  # noqa: PLC0415
  _, task, cfg, params = policy
  chunked = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, logits_chunk=2))
  rollout = sample(params, cfg, task, task.train_batch(0, 2, seed=1), jax.random.key(5))
  mask = np.asarray(rollout.completion_mask)
  update = np.asarray(update_logprobs(params, chunked, rollout))
  np.testing.assert_allclose(update[mask], np.asarray(rollout.logprobs)[mask], atol=1e-5)


def test_greedy_sampler_is_the_update_policys_argmax(policy):
  _, task, cfg, params = policy
  batch = task.test_batch(4)
  rollout = sample(params, cfg, task, batch, jax.random.key(1), temperature=0.0, group=1)
  vocab = cfg.text.vocab_size
  # Every first token scored by the update in one call: rows (prompt, candidate v).
  every = jax.tree.map(lambda x: None if x is None else jnp.repeat(x, vocab, axis=0), rollout)
  every = every._replace(completion_tokens=jnp.tile(jnp.arange(vocab), 4)[:, None],
                         completion_mask=jnp.ones((4 * vocab, 1), bool))
  logp = np.asarray(update_logprobs(params, cfg, every)).reshape(4, vocab)
  np.testing.assert_array_equal(np.asarray(rollout.completion_tokens)[:, 0], logp.argmax(1))
  np.testing.assert_allclose(np.exp(logp).sum(1), 1.0, atol=1e-5)


@pytest.mark.parametrize("train_tower", [True, False])
def test_the_towers_switch_freezes_or_trains_it(tmp_path, train_tower):
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  config = recipe()
  config.model.vision.train_tower = train_tower
  config.train.update(steps=2, eval_every=2, eval_size=8, eval_batch_size=8,
                      checkpoint_every=0, num_samples=0)
  config.rollout.num_prompts = 4
  config.rl.entropy_coef = 0.01  # a gradient for every param whatever the (rare) rewards
  start = build_model(ModelSection.of(config), jax.random.fold_in(jax.random.key(0), 0),
                      build_task(config))[1]
  state = train(config, str(tmp_path), log=lambda *a, **k: None)
  moved = lambda a, b: max(float(jnp.abs(x - y).max())  # noqa: E731
                           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert moved(state.train.params["text"], start["text"]) > 0
  tower = moved(state.train.params["vision"], start["vision"])
  assert (tower > 0) if train_tower else (tower == 0)


@pytest.mark.parametrize("setting, value, named", [
    ("rl.value_head", "shared", "rl.value_head=shared"),
    ("rollout.top_k", 5, "rollout.top_k/top_p=(5, 1.0)"),
    ("train.fused_steps", 4, "train.experience_source=fused"),
    ("warmup.steps", 10, "warmup.steps=10"),
])
def test_settings_it_does_not_run_are_one_sentence(setting, value, named):
  config = recipe()
  section, field = setting.split(".")
  config[section][field] = value
  with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
    check_vision_config(config)


def test_a_task_without_images_is_refused_with_model_vision():
  config = recipe()
  config.task = type(config.task)(dict(name="addition"))
  config.rollout.max_new_tokens = 4
  with pytest.raises(ConfigError, match="task has no images"):
    build_model(ModelSection.of(config), jax.random.key(0), build_task(config))
