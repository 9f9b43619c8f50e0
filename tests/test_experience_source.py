"""The seam between producer and learner: a source written in one file outside the package
(tests/plugins/one_step_stale_source.py, through config.imports) trains through the one
loop, its rows a policy version late; a source whose rows are staler than it declares is
refused in one sentence; an unknown source is one sentence."""

import json

import pytest

from grpo_jax.config import ConfigError
from grpo_jax.registry import import_plugins
from grpo_jax.train.sources.experience_source import (EXPERIENCE_SOURCES, for_source,
                                              register_experience_source)
from grpo_jax.train.stages.rl import train
from tests.fixtures import small_tiny_config

PLUGIN = "tests/plugins/one_step_stale_source.py"


def _records(path):
  with open(path / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


def test_a_source_from_a_plugin_file_trains_one_version_late(tmp_path,
                                                             first_token_parity_reward):
  config = small_tiny_config(steps=3, eval_every=3, num_minibatches=1)
  # A reward with a spread in most groups (conftest): step 2's update really moves the policy
  # (with every group tied it moves by rounding alone, which the gap below cannot rely on).
  config.reward.name = first_token_parity_reward
  config.imports = PLUGIN
  config.train.experience_source = "one_step_stale"
  state = train(config, str(tmp_path), log=lambda *_: None)
  assert EXPERIENCE_SOURCES.get("one_step_stale").max_staleness == 1
  assert config.rl.reuse_old_logprobs and config.rl.num_iterations == 1
  assert for_source(config.rl, config.train).reuse_old_logprobs is False  # rows may be stale
  config.train.experience_source = ""
  assert for_source(config.rl, config.train).reuse_old_logprobs is True  # "host" is on-policy
  records = _records(tmp_path)
  assert [r["step"] for r in records] == [0, 1, 2, 3] and int(state.step) == 3
  assert int(state.source.rollouts) == 3 and int(state.source.data_position) == 3 * 4
  # Step 1 learns from its own rollout, steps 2 and 3 from the one before theirs. The
  # sampler's log-probs then differ from the policy's old ones once the policy has moved
  # (step 1's update has learning rate 0, the schedule's warm-up: step 2's stale rows are
  # still the policy's; step 3's are not).
  assert [r["experience_staleness"] for r in records[1:]] == [0, 1, 1]
  gaps = [r["sampler_logprob_gap"] for r in records[1:]]
  assert gaps[0] < 1e-5 and gaps[1] < 1e-5 < gaps[2]
  assert "eval_accuracy" in records[-1]


def test_rows_staler_than_declared_are_refused(tmp_path):
  import_plugins(PLUGIN, log=lambda *_: None)
  make = EXPERIENCE_SOURCES.get("one_step_stale").make
  register_experience_source("stale_declared_fresh", replace=True)(make)
  config = small_tiny_config(steps=3, num_minibatches=1)
  config.train.experience_source = "stale_declared_fresh"
  try:
    with pytest.raises(ConfigError, match="produced rows of policy version 0 for the learner at "
                                          "step 1, 1 updates apart, outside the source's "
                                          "declared max_staleness=0"):
      train(config, str(tmp_path), log=lambda *_: None)
  finally:
    EXPERIENCE_SOURCES.unregister("stale_declared_fresh")
  assert [r["step"] for r in _records(tmp_path)] == [0, 1]  # nothing learned from them


def test_an_unknown_source_is_one_sentence(tmp_path):
  config = small_tiny_config(steps=1)
  config.train.experience_source = "replay_frist"
  with pytest.raises(ConfigError, match="train.experience_source='replay_frist' is unknown; "
                                        "valid: episodes, fused, fused_episodes, host"):
    train(config, str(tmp_path), log=lambda *_: None)
