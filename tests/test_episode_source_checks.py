"""What the episode sources ("episodes", "fused_episodes") cannot run is refused in one
sentence by config validation, or for stacked seeds before the devices start: before the
warm-up and before the workdir is written."""

import pytest

from configs import grpo_calculator_tiny, grpo_tiny
from grpo_jax.config import validate
from grpo_jax.errors import ConfigError
from grpo_jax.train.stages.rl import train

quiet = lambda *a: None  # noqa: E731


@pytest.mark.parametrize("source", ["episodes", "fused_episodes"])
def test_an_episode_source_on_a_task_without_episodes_is_refused_before_the_workdir(
    source, tmp_path):
  config = grpo_tiny.get_config()
  config.train.experience_source = source
  config.warmup.steps = 2  # refused before it
  with pytest.raises(ConfigError, match=rf"^train.experience_source='{source}' plays an "
                     r"environment's episodes; set task.name='env'"):
    train(config, str(tmp_path / "w"), log=quiet)
  assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())


@pytest.mark.parametrize("field,value", [("dynamic_sampling", True), ("gfpo_keep", 2)])
def test_the_episodes_source_with_dynamic_sampling_or_gfpo_is_refused_by_validation(field,
                                                                                     value):
  config = grpo_calculator_tiny.get_config()
  validate(config)
  config.rl[field] = value
  with pytest.raises(ConfigError, match=r"^train.experience_source='episodes' keeps every "
                     r"episode it plays; set rl.gfpo_keep=0 and rl.dynamic_sampling=False.$"):
    validate(config)


def test_fused_episodes_with_an_estimator_that_needs_more_than_rewards_is_refused_by_validation():
  config = grpo_calculator_tiny.get_config()
  config.train.experience_source = "fused_episodes"
  validate(config)
  config.rl.advantage = "remax"
  with pytest.raises(ConfigError, match=r"^train.experience_source='fused_episodes' gives the "
                     r"estimator rewards only, but it needs greedy_rewards; use "
                     r"train.experience_source='episodes'.$"):
    validate(config)


def test_stacked_seeds_on_the_episodes_source_are_refused_before_the_workdir(tmp_path):
  config = grpo_calculator_tiny.get_config()
  config.warmup.steps = 2
  with pytest.raises(ConfigError, match=r"^train.experience_source='episodes' runs one seed "
                     r"per program"):
    train(config, str(tmp_path / "w"), log=quiet, seeds=[0, 1])
  assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())
