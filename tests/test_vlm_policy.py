"""A vision-language policy in the RL loop ("the image reaches every pass"): the in-jit mRoPE
ids equal the host rule (HF's get_rope_index), the sampler's log-probs equal the update's on
the same rows, another image changes both, the tower freezes by its switch (with a critic),
and the run's export loads in transformers with our logits."""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.mrope import mrope_position_ids
from grpo_jax.models.vision.policy import fixed_grid_positions, image_tokens
from grpo_jax.models.vision.qwen2_5_vl_model import vlm_logits
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
  """2 RL steps each way. Trained: under GRPO, the run's export (train.export) loads in
  transformers' Qwen2_5_VLForConditionalGeneration with our logits on the task's image
  prompts (1e-4). Frozen: under PPO with a shared value head (GAE), the critic trains too."""
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  config = recipe()
  config.model.vision.train_tower = train_tower
  config.train.update(steps=2, eval_every=2, eval_size=8, eval_batch_size=8,
                      checkpoint_every=0, num_samples=0, export=train_tower)
  config.rollout.num_prompts = 4
  config.rl.entropy_coef = 0.01  # a gradient for every param whatever the (rare) rewards
  if not train_tower:
    config.rl.update(value_head="shared", advantage="gae")
  task = build_task(config)
  cfg, start = build_model(ModelSection.of(config), jax.random.fold_in(jax.random.key(0), 0),
                           task)
  state = train(config, str(tmp_path), log=lambda *a, **k: None)
  moved = lambda a, b: max(float(jnp.abs(x - y).max())  # noqa: E731
                           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert moved(state.train.params["text"], start["text"]) > 0
  tower = moved(state.train.params["vision"], start["vision"])
  assert (tower > 0) if train_tower else (tower == 0)
  if not train_tower:
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
      records = [r for r in map(json.loads, f) if "loss" in r]
    assert len(records) == 2 and all(np.isfinite(r["value_loss"]) for r in records)
    return
  transformers = pytest.importorskip("transformers")
  model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
      str(tmp_path / "hf_export"), attn_implementation="eager").eval()
  assert largest_logit_gap(model, state.train.params, task, cfg) < 1e-4


def largest_logit_gap(model, params, task, cfg) -> float:
  """max |ours - transformers'| logits over the real tokens of 4 of the task's held-out image
  prompts: a transformers Qwen2.5-VL `model` against vlm_logits on `params`."""
  torch = pytest.importorskip("torch")
  batch = task.test_batch(4)
  ids, mask = batch.prompt_tokens.astype(np.int64), batch.prompt_mask.astype(np.int64)
  pixels = batch.pixel_values.reshape(-1, batch.pixel_values.shape[-1])
  grid = np.tile(np.asarray(cfg.image_grid, np.int64), (len(ids), 1))
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                   mm_token_type_ids=torch.from_numpy((ids == cfg.image_token_id).astype(np.int64)),
                   pixel_values=torch.from_numpy(pixels),
                   image_grid_thw=torch.from_numpy(grid)).logits.numpy()
  ours = np.asarray(vlm_logits(jax.device_get(params), ids, mask, pixels, grid, cfg))
  return float(np.abs(ours - theirs)[mask.astype(bool)].max())


def test_a_task_without_images_is_refused_with_model_vision():
  config = recipe()
  config.task = type(config.task)(dict(name="addition"))
  config.rollout.max_new_tokens = 4
  with pytest.raises(ConfigError, match="task has no images"):
    build_model(ModelSection.of(config), jax.random.key(0), build_task(config))
