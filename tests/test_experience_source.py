"""A new experience source is one file: this one registers "replay_first", which samples the
first step's batch once and replays it at every step (experience that is not on-policy), then
runs it through the one loop. Because it declares on_policy=False, the update computes old
log-probs instead of reusing its own."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ConfigError
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.experience import RewardInputs
from grpo_jax.train.experience_source import (EXPERIENCE_SOURCES, for_source,
                                              register_experience_source, state_jit_options)
from grpo_jax.train.loop import train
from grpo_jax.train.metrics import rollout_metrics, step_record, step_tokens
from grpo_jax.train.state import policy_params
from grpo_jax.train.step import make_rl_step
from tests.fixtures import small_tiny_config

batches = []  # the replayed batch's completion tokens, once per step


@pytest.fixture
def replay_first():
  @register_experience_source("replay_first", on_policy=False)
  def make(run, state, samples_out):
    r_cfg = run.config.rollout
    group = r_cfg.group_size
    sampling = Sampling.of(run.spec.model_cfg, run.task, r_cfg).grouped(group)
    step = jax.jit(make_rl_step(run.spec), **state_jit_options(state, run))
    fixed = {}

    def advance(state):
      if not fixed:  # the first step's prompts and completions, by the policy at step 0
        prompts = run.task.train_batch(0, r_cfg.num_prompts, run.config.seed)
        rollout = sampling(policy_params(state), prompts.prompt_tokens, prompts.prompt_mask,
                           jax.random.key(7))
        rewards = run.task.score(prompts, np.asarray(rollout.completion_tokens),
                                 np.asarray(rollout.completion_mask), group)
        fixed.update(rollout=rollout, inputs=RewardInputs(jnp.asarray(rewards, jnp.float32), {},
                                                          jnp.int32(0)))
      rollout, inputs = fixed["rollout"], fixed["inputs"]
      batches.append(np.asarray(rollout.completion_tokens))
      state, metrics = step(state, rollout, inputs)
      stats = rollout_metrics(np.asarray(inputs.rewards), np.asarray(rollout.completion_mask),
                              np.asarray(rollout.truncated), group)
      record = step_record(jax.device_get(metrics), stats, run.config)
      return state, [[record]], [step_tokens(rollout)]

    return advance

  yield "replay_first"
  EXPERIENCE_SOURCES.unregister("replay_first")


def test_a_registered_source_runs_through_the_loop(tmp_path, replay_first):
  config = small_tiny_config(steps=3, eval_every=3, num_minibatches=1)
  config.train.experience_source = replay_first
  assert config.rl.reuse_old_logprobs and config.rl.num_iterations == 1
  assert for_source(config.rl, config.train).reuse_old_logprobs is False  # not on-policy
  config.train.experience_source = ""
  assert for_source(config.rl, config.train).reuse_old_logprobs is True  # "host" is
  config.train.experience_source = replay_first
  batches.clear()
  state = train(config, str(tmp_path), log=lambda *_: None)
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [0, 1, 2, 3] and int(state.step) == 3
  assert len(batches) == 3 and all(np.array_equal(b, batches[0]) for b in batches)
  # The replayed batch's sampler log-probs are step 0's: the gap to the policy is 0 at step 1
  # (the same params) and opens once the params move.
  gaps = [r["sampler_logprob_gap"] for r in records[1:]]
  assert gaps[0] < 1e-5 < gaps[2]
  assert "eval_accuracy" in records[-1]


def test_an_unknown_source_is_one_sentence(tmp_path):
  config = small_tiny_config(steps=1)
  config.train.experience_source = "replay_frist"
  with pytest.raises(ConfigError, match="train.experience_source='replay_frist' is unknown; "
                                        "valid: fused, host"):
    train(config, str(tmp_path), log=lambda *_: None)
