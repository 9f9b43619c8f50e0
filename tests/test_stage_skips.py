"""The supervised stages (SFT, RM, DPO) stop as the RL loop does once
train.max_consecutive_skips updates in a row were refused for a non-finite loss."""

import json

import jax.numpy as jnp
import pytest

from configs import rlhf_tiny_sft
from grpo_jax import config as config_lib
from grpo_jax.errors import ConfigError, RunStopped
from grpo_jax.train.run.checkpoint import Checkpoints
from tests.fixtures import with_fields

quiet = lambda *a: None  # noqa: E731


def _records(workdir):
  with open(workdir / "metrics.jsonl") as f:
    return [json.loads(line) for line in f]


def _assert_stopped_at_step_2(workdir, loss_key):
  records = _records(workdir)
  assert [r["step"] for r in records] == [0, 1, 2]  # the step that stopped the run is written
  assert all(r[loss_key] != r[loss_key] for r in records[1:])  # NaN
  ckpts = Checkpoints(workdir / "checkpoints", 3)
  assert ckpts.steps() == [0, 1]  # ... and not saved
  ckpts.close()
  assert not (workdir / "hf_export").exists()  # nothing exported


def test_a_reward_model_whose_every_loss_is_nan_stops_after_max_consecutive_skips(
    monkeypatch, tmp_path):
  from grpo_jax.train.stages import supervised
  monkeypatch.setattr(supervised, "bradley_terry_loss", lambda c, r, m: jnp.nan * jnp.sum(c - r))
  config = with_fields(rlhf_tiny_sft.get_config(), {
      "warmup.steps": 0, "rm.steps": 4, "rm.batch_size": 8, "rm.eval_every": 4,
      "rm.train_pairs": 16, "rm.test_pairs": 8, "rm.policy_fraction": 0.0,
      "train.checkpoint_every": 1, "train.max_consecutive_skips": 2})
  with pytest.raises(RunStopped, match=r"^2 optimizer updates in a row were skipped .*at step 2, "
                     r"train.max_consecutive_skips=2\)"):
    supervised.train_reward_model(config, str(tmp_path), log=quiet)
  _assert_stopped_at_step_2(tmp_path, "loss")


def test_an_sft_stage_whose_every_loss_is_nan_stops_after_max_consecutive_skips(
    monkeypatch, tmp_path):
  from grpo_jax.train.stages import supervised, warmup
  real = warmup.sft_loss
  monkeypatch.setattr(warmup, "sft_loss", lambda *a: jnp.nan * real(*a))
  config = with_fields(rlhf_tiny_sft.get_config(), {
      "warmup.steps": 4, "warmup.batch_size": 8, "train.eval_size": 8,
      "train.eval_batch_size": 8, "train.checkpoint_every": 1, "train.max_consecutive_skips": 2})
  with pytest.raises(RunStopped, match=r"^2 optimizer updates in a row were skipped .*at step 2, "
                     r"train.max_consecutive_skips=2\)"):
    supervised.train_sft(config, str(tmp_path), log=quiet)
  _assert_stopped_at_step_2(tmp_path, "sft_loss")


def test_a_dpo_stage_whose_every_loss_is_nan_stops_after_max_consecutive_skips(monkeypatch,
                                                                               tmp_path):
  from configs import dpo_tiny
  from grpo_jax.train.stages import preference, preference_step
  losses = preference_step.PREFERENCE_LOSSES

  class NanLosses:
    get = staticmethod(losses.get)

    @staticmethod
    def bind(name, section):
      loss = losses.bind(name, section)
      return lambda p: jnp.nan * loss(p)

  monkeypatch.setattr(preference_step, "PREFERENCE_LOSSES", NanLosses)
  config = with_fields(dpo_tiny.get_config(), {
      "warmup.steps": 0, "dpo.steps": 4, "dpo.batch_size": 8, "dpo.eval_every": 4,
      "dpo.train_pairs": 16, "dpo.test_pairs": 8, "train.eval_size": 8,
      "train.eval_batch_size": 8, "train.checkpoint_every": 1, "train.max_consecutive_skips": 2})
  with pytest.raises(RunStopped, match=r"^2 optimizer updates in a row were skipped .*at step 2, "
                     r"train.max_consecutive_skips=2\)"):
    preference.train_dpo(config, str(tmp_path), log=quiet)
  _assert_stopped_at_step_2(tmp_path, "loss")


def test_a_nan_reward_model_margin_is_refused_in_one_sentence():
  config = rlhf_tiny_sft.get_config()
  config.rm.margin = float("nan")
  with pytest.raises(ConfigError, match=r"^rm.margin=nan; use a finite margin"):
    config_lib.validate(config)


def test_an_rl_warm_up_whose_every_loss_is_nan_stops_after_max_consecutive_skips(
    monkeypatch, tmp_path):
  """The RL and DPO warm-ups refused each such update but went on, and the run started from
  the unwarmed policy; the stop is read at the warm-up's progress lines (5) and its end."""
  from configs import grpo_tiny  # noqa: PLC0415
  from grpo_jax.train.stages import warmup  # noqa: PLC0415
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  real = warmup.sft_loss
  monkeypatch.setattr(warmup, "sft_loss", lambda *a: jnp.nan * real(*a))
  config = with_fields(grpo_tiny.get_config(), {
      "warmup.steps": 5, "warmup.batch_size": 8, "train.steps": 2,
      "train.max_consecutive_skips": 3})
  with pytest.raises(RunStopped, match=r"^3 warm-up updates in a row were skipped for a "
                     r"non-finite loss or gradient \(by warm-up step 3 of 5, "
                     r"train.max_consecutive_skips=3\); lower warmup.learning_rate"):
    train(config, str(tmp_path), log=quiet)
  assert not (tmp_path / "checkpoints" / "0").exists()
