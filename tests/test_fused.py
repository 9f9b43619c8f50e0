"""The fused path (grpo_jax/train/sources/fused.py): the whole RL iteration in one program equals the
host path's step, runs K steps per call, and composes with seeds."""

import json

import jax
import numpy as np
import pytest

from grpo_jax.config import ConfigError, validate
from grpo_jax.rl.estimators import ESTIMATORS
from grpo_jax.train.sources.collect import Samplers, collect
from grpo_jax.train.sources.fused import make_device_experience, make_fused_iteration
from grpo_jax.train.sources.experience_source import Run
from grpo_jax.train.stages.rl import initial_state, train
from grpo_jax.train.run.metrics import TIMING_KEYS
from grpo_jax.train.run.seed_axis import SeedAxis
from grpo_jax.train.run.sections import ModelSection, RewardSection
from grpo_jax.train.run.setup import build_model, build_task
from grpo_jax.train.learner.state import RunState, create_source_state, make_optimizer, rollout_key
from grpo_jax.train.learner.step import StepSpec, make_rl_step
from grpo_jax.rollout.sampler import generate, sample
from tests.fixtures import small_tiny_config

quiet = lambda *a, **k: None  # noqa: E731


def _config(**rl):
  c = small_tiny_config()
  c.train.checkpoint_every = 2
  c.rl.update(rl)
  return c


def _run_and_state(config):
  validate(config)
  task = build_task(config, quiet)
  model_cfg, params = build_model(ModelSection.of(config), jax.random.key(0))
  optimizer = make_optimizer(config.optim, 100)
  spec = StepSpec(model_cfg, config.rl, optimizer, config.rollout.group_size,
                  config.rollout.temperature, config.rollout.max_new_tokens)
  run = Run.of(config, SeedAxis((0,)), task, spec, (jax.random.key(0),), ("",), None, quiet)
  state = initial_state(config.rl, model_cfg, params, optimizer, jax.random.key(0))
  # a position past the stream's start
  source = create_source_state(state.key).replace(data_position=np.int32(8))
  return run, state, source


@pytest.mark.parametrize("rl", [dict(), dict(advantage="process"), dict(advantage="remax")])
def test_first_fused_step_equals_the_host_path(rl, first_token_parity_reward):
  """Same tokens, rewards and estimator inputs as the host's collect, and the same state
  after the step (params within 1e-6), for plain GRPO and the estimators with extra inputs
  (a reward with a spread under a random policy: the parity reward of conftest)."""
  config = _config(**rl)
  config.reward.name = first_token_parity_reward
  run, state, source = _run_and_state(config)
  r = config.rollout
  common = dict(model_cfg=run.spec.model_cfg, max_new_tokens=r.max_new_tokens,
                eos_id=run.task.eos_id, pad_id=run.task.pad_id)
  samplers = Samplers(
      sample=lambda p, t, m, k: sample(p, t, m, k, temperature=r.temperature,
                                       group_size=r.group_size, **common),
      greedy=lambda p, t, m: generate(p, t, m, jax.random.key(0), temperature=0.0, **common))
  (host,) = collect(state.params, [8], [rollout_key(source)], run.task, run.settings, samplers,
                    run.axis, run.needs)
  device_task = run.task.device_task()
  table = jax.tree.map(jax.numpy.asarray, device_task.stream(0, 64))
  rollout, inputs, _ = jax.jit(make_device_experience(run, device_task))(state, source,
                                                                             table)
  np.testing.assert_array_equal(rollout.prompt_tokens, host.rollout.prompt_tokens)
  np.testing.assert_array_equal(rollout.completion_tokens, host.rollout.completion_tokens)
  np.testing.assert_array_equal(rollout.completion_mask, host.rollout.completion_mask)
  np.testing.assert_allclose(rollout.logprobs, host.rollout.logprobs, atol=1e-6)
  np.testing.assert_array_equal(inputs.rewards, host.inputs.rewards)
  assert sorted(inputs.extras) == sorted(host.inputs.extras) == sorted(
      ESTIMATORS.get(config.rl.advantage).needs)
  for a, b in zip(jax.tree.leaves(inputs.extras), jax.tree.leaves(host.inputs.extras)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  rl_step = jax.jit(make_rl_step(run.spec))
  want, want_metrics = rl_step(state, host.rollout, host.inputs)
  got, got_metrics = jax.jit(make_fused_iteration(run, device_task))(RunState(state, source),
                                                                     table)
  got, got_source = got.train, got.source
  moved = 0.0
  for a, b, before in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params),
                          jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    moved = max(moved, float(np.max(np.abs(np.asarray(b) - np.asarray(before)))))
  assert moved > 1e-4  # a real update
  assert int(got_source.data_position) == 8 + r.num_prompts and int(got_source.rollouts) == 1
  assert int(got.step) == 1
  assert float(got_metrics["loss"]) == pytest.approx(float(want_metrics["loss"]), abs=1e-6)


def _records(path):
  with open(path) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in f]


@pytest.mark.slow
@pytest.mark.xla_defaults
def test_fused_seeds_equal_fused_single_runs_and_resume(tmp_path):
  """train.fused_steps=2 over 4 steps: two seeds lax.mapped in one program give each seed's
  fused run alone bit for bit, K records per call; a stop at step 2 resumes to the same."""
  config = _config()
  config.train.fused_steps = 2
  for s in (0, 1):
    c = config.copy_and_resolve_references()
    c.seed = s
    train(c, str(tmp_path / f"run{s}"), log=quiet)
  train(config, str(tmp_path / "seeds"), log=quiet, seeds=[0, 1], seed_axis="map")
  for s in (0, 1):
    alone = _records(tmp_path / f"run{s}" / "metrics.jsonl")
    assert [r["step"] for r in alone] == [0, 1, 2, 3, 4]
    assert "eval_accuracy" in alone[2] and "eval_accuracy" not in alone[1]
    assert _records(tmp_path / "seeds" / f"seed_{s}" / "metrics.jsonl") == alone
  short = config.copy_and_resolve_references()
  short.train.steps = 2
  train(short, str(tmp_path / "resumed"), log=quiet)
  train(config, str(tmp_path / "resumed"), log=quiet)
  assert _records(tmp_path / "resumed" / "metrics.jsonl") == _records(
      tmp_path / "run0" / "metrics.jsonl")


def test_what_the_fused_path_cannot_run_is_refused():
  config = _config()
  config.train.fused_steps = 3
  with pytest.raises(ConfigError, match="train.steps=4 is not a multiple of "
                                        "train.fused_steps=3"):
    validate(config)
  config.train.fused_steps = 2
  config.rl.dynamic_sampling = True
  with pytest.raises(ConfigError, match="cannot resample"):
    validate(config)
  config.rl.dynamic_sampling = False
  config.train.fused_steps = -1
  with pytest.raises(ConfigError, match="train.fused_steps=-1"):
    validate(config)


def test_the_fused_sources_named_without_fused_steps_are_checked_too():
  """train.experience_source='fused' (or 'fused_episodes') with train.fused_steps=0 runs one
  fused step per call, but the checks ran only for fused_steps > 0: GFPO (whose estimator then
  split each group in two), dynamic sampling and a rule weight passed and were not applied.
  The host's 'episodes' source likewise never applies reward.rule_weight / combine / models."""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  for fields, message in (
      (dict(gfpo_keep=4), "train.experience_source='fused' needs the task's own reward alone"),
      (dict(dynamic_sampling=True), "train.experience_source='fused' cannot resample")):
    config = _config()
    config.train.update(fused_steps=0, experience_source="fused")
    config.rl.update(fields)
    with pytest.raises(ConfigError, match=message + r".* train.experience_source=''"):
      validate(config)
  for source, change in (("episodes", dict(rule_weight=0.5)), ("episodes", dict(combine=
                         "normalise_then_sum")), ("fused_episodes", dict(rule_weight=0.5))):
    config = grpo_calculator_tiny.get_config()
    config.train.experience_source = source
    config.reward.update(change)
    with pytest.raises(ConfigError, match=f"train.experience_source='{source}'"):
      validate(config)
  validate(grpo_calculator_tiny.get_config())  # the defaults pass
