"""A vision-language policy runs what the text policies run, because its decoder is theirs
(models/decoder.py with the qwen2_5_vl blocks) and its images enter every engine as the
prompts' inputs (models/prompt_inputs.py): the warm-up on its own text, top-k / top-p
sampling, the slot-refill engine (the same tokens as the static one), the shared-prompt and
packed passes, a shared value head that sees the image (PPO's 2 steps: test_vlm_policy.py's
frozen-tower run; the export: its trained-tower run); and what still cannot run is one
sentence each."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.build import check_vision_config
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.run.sections import ModelSection
from grpo_jax.train.run.setup import build_model, build_task
from grpo_jax.train.learner.forward import policy_and_values
from tests.test_vlm_policy import policy, recipe, sample  # noqa: F401  (policy: a fixture)


def tiny_run(tmp_path, lines=None, **overrides):
  """2 RL steps of the vision recipe at 4 prompts; its metrics.jsonl records (the log's lines
  appended to `lines`)."""
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  config = recipe()
  config.train.update(steps=2, eval_every=2, eval_size=8, eval_batch_size=8,
                      checkpoint_every=0, num_samples=0)
  config.rollout.num_prompts = 4
  for key, value in overrides.items():
    section, field = key.split(".")
    config[section][field] = value
  check_vision_config(config)
  train(config, str(tmp_path), log=lambda *a, **k: None if lines is None else lines.append(a[0]))
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_the_shared_value_head_sees_the_image(policy):
  """The head on the policy's hidden states: another image moves the values."""
  _, task, cfg, params = policy
  batch = task.train_batch(0, 2, seed=0)
  rollout = sample(params, cfg, task, batch, jax.random.key(0))
  head = {"head": {"kernel": jax.random.normal(jax.random.key(1), (cfg.hidden_size, 1)),
                   "bias": jnp.zeros((1,))}}
  values = lambda r: np.asarray(policy_and_values(params, head, r, cfg, "shared", 1.0)[2])  # noqa
  other = jnp.repeat(jnp.asarray(task.train_batch(50, 2, seed=0).pixel_values), 4, axis=0)
  mask = np.asarray(rollout.completion_mask)
  assert np.abs(values(rollout))[mask].min() > 0
  assert np.abs(values(rollout._replace(images=other)) - values(rollout))[mask].max() > 1e-4


def test_the_warm_up_on_its_own_text_then_top_k_and_top_p_steps(tmp_path):
  """One run (the compiles shared): 5 warm-up steps on the decoder's text rows, then 2 RL steps
  sampling under top-k 8 and top-p 0.9."""
  lines = []
  records = tiny_run(tmp_path, lines, **{"warmup.steps": 5, "warmup.learning_rate": 1e-2,
                                         "warmup.batch_size": 16, "rollout.top_k": 8,
                                         "rollout.top_p": 0.9})
  losses = [float(line.split("sft loss")[1]) for line in lines if "sft loss" in line]
  # The answer's form learnt from the text rows, down from a random decoder's ~log(80).
  assert len(losses) == 5 and losses[0] > 4.0 and losses[-1] < losses[0] - 1.0
  steps = [r for r in records if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2] and all(np.isfinite(r["loss"]) for r in steps)
  # After the warm-up the policy answers L or R: its held-out accuracy is about a coin's.
  assert records[-1]["eval_accuracy"] > 0.2


def test_slot_refill_draws_the_static_engines_tokens():
  config = recipe()
  task = build_task(config)
  cfg, params = build_model(ModelSection.of(config), jax.random.key(3), task)
  batch = task.train_batch(0, 3, seed=0)
  sampling = Sampling.of(cfg, task, config.rollout, max_new_tokens=6).grouped(4)
  args = (params, batch.prompt_tokens, batch.prompt_mask, jax.random.key(7))
  static = sampling.with_stats(*args, images=batch.pixel_values)[0]
  refill = Sampling(**{**sampling.__dict__, "decode_slots": 4}).with_stats(
      *args, images=batch.pixel_values)[0]
  np.testing.assert_array_equal(refill.completion_tokens, static.completion_tokens)
  np.testing.assert_array_equal(refill.completion_mask, static.completion_mask)
  np.testing.assert_allclose(refill.logprobs, static.logprobs, atol=1e-5)
  np.testing.assert_array_equal(refill.images, static.images)


def test_shared_prompt_and_packed_passes_equal_the_per_row_pass(policy):
  _, task, cfg, params = policy
  rollout = sample(params, cfg, task, task.train_batch(0, 3, seed=2), jax.random.key(4),
                   temperature=1.5)
  mask = np.asarray(rollout.completion_mask)
  per_row = np.asarray(policy_and_values(params, None, rollout, cfg, "none", 1.5)[0])
  shared = np.asarray(policy_and_values(params, None, rollout, cfg, "none", 1.5, group=4)[0])
  packed = np.asarray(policy_and_values(params, None, rollout, cfg, "none", 1.5, group=4,
                                        token_capacity=int(mask.sum()))[0])
  np.testing.assert_allclose(shared[mask], per_row[mask], atol=1e-5)
  np.testing.assert_allclose(packed[mask], per_row[mask], atol=1e-5)
  np.testing.assert_allclose(per_row[mask], np.asarray(rollout.logprobs)[mask], atol=1e-5)


@pytest.mark.parametrize("setting, value, named", [
    ("rl.value_head", "separate", "rl.value_head=separate"),
    ("train.fused_steps", 4, "train.experience_source=fused"),
])
def test_settings_it_does_not_run_are_one_sentence(setting, value, named):
  config = recipe()
  section, field = setting.split(".")
  config[section][field] = value
  with pytest.raises(ConfigError, match=named):
    check_vision_config(config)
