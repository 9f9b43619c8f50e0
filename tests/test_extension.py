"""Adding an advantage estimator and a reward is one file, with no edit of grpo_jax/: here they
are registered in this test file (and, for the command line, in a plugin file named by
config.imports), then a run of two steps uses them."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ConfigError, validate
from grpo_jax.rewards.registry import REWARDS, register_reward
from grpo_jax.rl.advantages import broadcast_to_tokens
from grpo_jax.rl.estimators import ESTIMATORS, register_estimator
from grpo_jax.train.stages.rl import train
from tests.fixtures import small_tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
seen = []  # (rewards, advantages) the estimator computed, by a host callback


@pytest.fixture
def registered():
  """A max-baseline estimator (A_i = r_i - max_group(r)) and a first-token-parity reward."""
  @register_estimator("max_baseline", groups=True)
  def max_baseline(x):
    seq = x.sequence_rewards()
    best = jnp.repeat(seq.reshape(-1, x.group_size).max(axis=1), x.group_size)
    advantages = broadcast_to_tokens(seq - best, x.mask)
    jax.debug.callback(lambda r, a: seen.append((np.asarray(r), np.asarray(a))), seq,
                       advantages)
    return advantages, None

  @register_reward("first_token_odd", kind="tokens")
  def first_token_odd(tokens, mask, targets, target_mask):
    return (tokens[:, 0] % 2 == 1).astype(jnp.float32)

  yield
  ESTIMATORS.unregister("max_baseline")
  REWARDS.unregister("first_token_odd")


def _config():
  return small_tiny_config(steps=2)


def test_a_registered_estimator_and_reward_run_two_steps(tmp_path, registered):
  config = _config()
  config.rl.advantage = "max_baseline"
  config.reward.name = "first_token_odd"
  seen.clear()
  state = train(config, str(tmp_path), log=lambda *_: None)
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [0, 1, 2] and int(state.step) == 2
  assert len(seen) == 2  # the estimator ran in each step (inside the jitted RL step)
  for rewards, advantages in seen:
    assert set(np.unique(rewards)) <= {0.0, 1.0} and 0 < rewards.mean() < 1
    best = rewards.reshape(-1, 4).max(1).repeat(4)
    want = (rewards - best)[:, None] * (advantages != 0)
    np.testing.assert_array_equal(advantages, want)  # NumPy reference of the formula
    assert np.all(advantages <= 0)
  for record, (rewards, _) in zip(records[1:], seen):
    assert record["reward_mean"] == pytest.approx(float(rewards.mean()))


def test_validation_lists_registered_names(registered):
  config = _config()
  config.rl.advantage = "max_baselin"
  with pytest.raises(ConfigError, match="rl.advantage='max_baselin' is unknown; valid: .*"
                                        "max_baseline"):
    validate(config)
  config.rl.advantage = "grpo"
  config.reward.name = "gsm8k_strict"
  with pytest.raises(ConfigError, match="'gsm8k_strict' is a text reward but task 'addition' "
                                        "scores with tokens rewards; valid: .*first_token_odd"):
    validate(config)


@pytest.mark.slow
def test_a_plugin_file_on_the_command_line(tmp_path):
  """config.imports names a file of the user's; its registrations count (no grpo_jax/ edit)."""
  plugin = tmp_path / "my_rl.py"
  plugin.write_text(textwrap.dedent('''
      import jax.numpy as jnp
      from grpo_jax.rl.advantages import broadcast_to_tokens
      from grpo_jax.rl.estimators import register_estimator

      @register_estimator("mean_baseline_unscaled", groups=True)
      def mean_baseline_unscaled(x):
        seq = x.sequence_rewards()
        mean = jnp.repeat(seq.reshape(-1, x.group_size).mean(axis=1), x.group_size)
        return broadcast_to_tokens(seq - mean, x.mask), None
  '''))
  args = ["--config.warmup.steps=5", "--config.train.steps=2", "--config.train.eval_every=2",
          "--config.train.eval_size=20", "--config.train.eval_batch_size=10",
          "--config.rollout.num_prompts=4", "--config.rollout.group_size=4",
          f"--config.imports={plugin}", "--config.rl.advantage=mean_baseline_unscaled"]
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
                        f"--workdir={tmp_path / 'run'}", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "step    2/2" in out.stdout
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert config["rl"]["advantage"] == "mean_baseline_unscaled"
  missing = subprocess.run([sys.executable, "-m", "grpo_jax.main",
                            "--config=configs/grpo_tiny.py", f"--workdir={tmp_path / 'bad'}",
                            "--config.imports=no_such_module_xyz"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
  assert missing.returncode == 2
  assert missing.stderr.strip().splitlines() == [
      "error: imports: module 'no_such_module_xyz' cannot be imported (No module named "
      "'no_such_module_xyz'); give an importable module name or a path to a .py file."]


@pytest.fixture
def length_input():
  """An estimator that needs a new per-row input, "completion_length", and its provider (host
  and device forms): the whole extension, here in one file (must-show 2a of issue 30)."""
  from grpo_jax.rewards.estimator_inputs import INPUTS, Provided, register_input
  lengths_seen.clear()

  @register_input("completion_length",
                  device=lambda r: jnp.sum(r.mask, axis=1).astype(jnp.float32))
  def completion_length(r):
    return Provided(np.asarray(r.rollout.completion_mask).sum(1).astype(np.float32))

  @register_estimator("length_penalised", groups=True, needs=("completion_length",))
  def length_penalised(x):
    seq = x.sequence_rewards() - 0.01 * x.extras["completion_length"]
    mean = jnp.repeat(seq.reshape(-1, x.group_size).mean(axis=1), x.group_size)
    jax.debug.callback(lambda n, m: lengths_seen.append((np.asarray(n), np.asarray(m))),
                       x.extras["completion_length"], x.mask)
    return broadcast_to_tokens(seq - mean, x.mask), None

  yield
  ESTIMATORS.unregister("length_penalised")
  INPUTS.unregister("completion_length")


lengths_seen = []  # (the provided input, the completion mask) per step


@pytest.mark.parametrize("fused_steps", [0, 1])
def test_an_estimator_with_a_new_input_runs_on_both_sources(tmp_path, length_input,
                                                            fused_steps):
  """The provider's input reaches the estimator row-aligned with the rollout, made on the host
  (host source) or on the devices (fused source)."""
  config = _config()
  config.rl.advantage = "length_penalised"
  config.train.fused_steps = fused_steps
  train(config, str(tmp_path), log=lambda *_: None)
  assert len(lengths_seen) == 2
  for lengths, mask in lengths_seen:
    np.testing.assert_array_equal(lengths, mask.sum(1))
    assert lengths.shape == (16,) and lengths.max() > 0


def test_an_input_no_provider_makes_is_refused(length_input):
  from grpo_jax.rewards.estimator_inputs import INPUTS
  config = _config()
  config.rl.advantage = "length_penalised"
  validate(config)
  provider = INPUTS.get("completion_length")
  INPUTS.register("completion_length", dataclasses.replace(provider, device=None),
                  replace=True)
  config.train.fused_steps = 1
  with pytest.raises(ConfigError, match="^rl.advantage='length_penalised' needs "
                                        "completion_length, which has no device form; the "
                                        r"fused experience source cannot make it \(use the "
                                        r"host source\).$"):
    validate(config)
  INPUTS.unregister("completion_length")
  with pytest.raises(ConfigError, match="needs completion_length, which no provider makes"):
    validate(config)


def test_an_entrys_hyperparameters_are_bound_from_rl_and_checked():
  """An estimator's keyword-only parameters are rl fields bound when it is built: the default
  when the section lacks the field, the section's value when a recipe sets it, and its
  registered check refuses a bad value before any compute, in one sentence."""
  from grpo_jax.defaults import rl_defaults  # noqa: PLC0415
  from grpo_jax.rl.estimators import make_estimator  # noqa: PLC0415

  @register_estimator("scaled_mean_baseline", groups=True,
                      check=lambda scale: None if scale > 0 else f"rl.scale={scale}; use > 0.")
  def scaled(x, *, scale=2.0):
    seq = x.sequence_rewards()
    mean = jnp.repeat(seq.reshape(-1, x.group_size).mean(axis=1), x.group_size)
    return broadcast_to_tokens(scale * (seq - mean), x.mask), None

  try:
    rewards = jnp.asarray([1.0, 0.0, 0.0, 0.0])
    mask = jnp.ones((4, 3), bool)
    tokens = jnp.zeros((4, 3)).at[:, -1].set(rewards)
    rl = rl_defaults(advantage="scaled_mean_baseline")
    assert "scale" not in rl  # a plugin's field: its default applies
    adv, _ = make_estimator(rl)(4, tokens, mask, None)
    np.testing.assert_allclose(np.asarray(adv[:, 0]), 2.0 * np.array([0.75, -0.25, -0.25, -0.25]))
    rl.scale = 0.5  # what a recipe does to set it
    adv, _ = make_estimator(rl)(4, tokens, mask, None)
    np.testing.assert_allclose(np.asarray(adv[:, 0]), 0.5 * np.array([0.75, -0.25, -0.25, -0.25]))
    config = _config()
    config.rl.advantage = "scaled_mean_baseline"
    config.rl.scale = -1.0
    with pytest.raises(ConfigError, match=r"^rl.scale=-1.0; use > 0.$"):
      validate(config)
  finally:
    ESTIMATORS.unregister("scaled_mean_baseline")


def test_built_in_hyperparameter_defaults_are_the_rl_sections():
  """The rl section's defaults for entry fields are those the built-in entries declare, and
  two owners of one field cannot declare two defaults."""
  from grpo_jax.defaults import rl_defaults  # noqa: PLC0415
  from grpo_jax.registry import declared_defaults  # noqa: PLC0415
  rl = rl_defaults()
  assert (rl.clip_eps_low, rl.clip_eps_high, rl.dual_clip_c, rl.log_ratio_clamp) == (
      0.2, 0.2, 0.0, 20.0)
  assert (rl.advantage_eps, rl.gamma, rl.lam, rl.whiten_advantages) == (1e-6, 1.0, 1.0, False)

  def other(x, *, gamma=0.99):
    return x
  with pytest.raises(ValueError, match="declares gamma=0.99, but its section's default is 1.0"):
    declared_defaults([other], {"gamma": 1.0})
