"""S seeds in one program (`train(..., seeds=...)`, a SeedAxis over the same step and loop)
against S separate runs."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_tiny
from grpo_jax.config import ConfigError
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.stages.rl import initial_state, train
from grpo_jax.train.run.metrics import TIMING_KEYS
from grpo_jax.train.run.seed_axis import SeedAxis
from grpo_jax.train.run.sections import ModelSection
from grpo_jax.train.run.setup import build_model, build_task
from grpo_jax.train.learner.state import make_optimizer
from grpo_jax.train.learner.step import StepSpec, make_rl_step

SEEDS = [0, 1, 2]
quiet = lambda *a, **k: None  # noqa: E731


def _small_config(steps=3):
  c = grpo_tiny.get_config()
  c.warmup.steps = 5
  c.warmup.batch_size = 32
  c.train.steps = steps
  c.train.eval_every = 2
  c.train.eval_size = 20
  c.train.eval_batch_size = 10
  c.train.eval_pass_k = 2  # exercises the per-seed evaluation keys too
  c.rollout.num_prompts = 4
  c.rollout.group_size = 4
  c.rl.num_iterations = 2
  c.rl.num_minibatches = 2
  return c


def _records(path):
  with open(path) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in f]


def _separate_and_stacked(config, tmp_path, seeds=SEEDS):
  separate = []
  for s in seeds:
    c = config.copy_and_resolve_references()
    c.seed = s
    separate.append(train(c, str(tmp_path / f"run{s}"), log=quiet))
  stacked = train(config, str(tmp_path / "seeds"), log=quiet, seeds=seeds, seed_axis="map")
  return separate, stacked


def _assert_equal_runs(tmp_path, separate, stacked, seeds, steps):
  for i, s in enumerate(seeds):
    alone = _records(tmp_path / f"run{s}" / "metrics.jsonl")
    together = _records(tmp_path / "seeds" / f"seed_{s}" / "metrics.jsonl")
    assert [r["step"] for r in together] == list(range(steps + 1))
    assert together == alone, s
    for a, b in zip(jax.tree.leaves(separate[i].train.params),
                    jax.tree.leaves(stacked.train.params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b[i]))


@pytest.mark.slow
@pytest.mark.xla_defaults
def test_seeds_in_one_program_equal_separate_runs_bit_for_bit(tmp_path,
                                                             first_token_parity_reward):
  """seed_axis="map": every record of every seed (their pass@k evaluations with per-seed keys
  among them), and the final params, are identical to S separate runs. A feature of the step
  works for S seeds too: DAPO's dynamic sampling, whose resampling rounds differ between
  seeds. The parity reward (conftest) leaves a random policy's groups without a spread one
  time in 8, so the runs start from the random policy: no warm-up (its SFT step, compiled
  alone and mapped under XLA's defaults, was a seventh of this test's time). The mapped
  warm-up's bits are tests/test_fused.py::test_fused_seeds_equal_fused_single_runs_and_resume's
  claim (5 warm-up steps, two seeds mapped against each alone, under XLA's defaults too)."""
  config = _small_config(steps=4)
  config.warmup.steps = 0
  config.reward.name = first_token_parity_reward
  config.rl.update(dynamic_sampling=True, max_extra_rollouts=3)
  separate, stacked = _separate_and_stacked(config, tmp_path)
  _assert_equal_runs(tmp_path, separate, stacked, SEEDS, 4)
  rounds = [[r["sampling_rounds"] for r in _records(tmp_path / "seeds" / f"seed_{s}" /
                                                    "metrics.jsonl")[1:]] for s in SEEDS]
  assert len({tuple(r) for r in rounds}) > 1, rounds  # the seeds resampled differently
  assert max(max(r) for r in rounds) > 1, rounds
  # The seeds did differ (the comparison above could fail).
  assert _records(tmp_path / "run0" / "metrics.jsonl") != _records(
      tmp_path / "run1" / "metrics.jsonl")


def _one_step_pieces(config):
  """Random policies of 3 seeds and the run's pieces."""
  task = build_task(config, quiet)
  model_cfg = build_model(ModelSection.of(config), jax.random.key(0))[0]
  optimizer = make_optimizer(config.optim, 100)
  states = []
  for s in SEEDS:
    params = build_model(ModelSection.of(config), jax.random.fold_in(jax.random.key(s), 0))[1]
    states.append(initial_state(config.rl, model_cfg, params, optimizer, jax.random.key(s)))
  return task, model_cfg, optimizer, states


def test_vmapped_step_matches_single_seed_step_to_float_rounding():
  """seed_axis="vmap": from the same states, the vmapped rollout and RL step give each seed
  the single-seed tokens exactly and its floats to rounding (XLA vectorises a batched
  reduction differently, so bit equality is not promised)."""
  config = _small_config()
  # Warm-up 1: the step's first of 4 updates has rate 0, the next the full rate (at warm-up 0
  # Adam's first update, about lr x sign(g), enlarges rounding past the atol below).
  config.optim.warmup_steps = 1
  task, model_cfg, optimizer, states = _one_step_pieces(config)
  r, g = config.rollout, config.rollout.group_size
  common = dict(model_cfg=model_cfg, max_new_tokens=r.max_new_tokens, eos_id=task.eos_id,
                pad_id=task.pad_id, temperature=1.0)
  prompts = [task.train_batch(0, r.num_prompts, s) for s in SEEDS]
  tokens = [np.repeat(p.prompt_tokens, g, 0) for p in prompts]
  masks = [np.repeat(p.prompt_mask, g, 0) for p in prompts]
  keys = [jax.random.key(100 + s) for s in SEEDS]
  rng = np.random.default_rng(0)
  inputs = [RewardInputs(rng.integers(0, 2, r.num_prompts * g).astype(np.float32), {},
                         np.int32(r.num_prompts)) for _ in SEEDS]
  rl_step = make_rl_step(StepSpec(model_cfg, config.rl, optimizer, g, 1.0, r.max_new_tokens))
  single = []
  for i in range(len(SEEDS)):
    rollout = generate(states[i].params, tokens[i], masks[i], keys[i], **common)
    new_state, metrics = jax.jit(rl_step)(states[i], rollout, inputs[i])
    single.append((rollout, new_state, metrics))

  axis = SeedAxis(tuple(SEEDS), "vmap")
  stacked = axis.stack(states)
  rollouts = axis.compile(lambda p, t, m, k: generate(p, t, m, k, **common))(
      stacked.params, axis.stack(tokens), axis.stack(masks), axis.stack(keys))
  new_states, metrics = axis.compile(rl_step)(stacked, rollouts, axis.stack(inputs))
  for i, (rollout, new_state, one_metrics) in enumerate(single):
    np.testing.assert_array_equal(rollout.completion_tokens, rollouts.completion_tokens[i])
    np.testing.assert_allclose(rollout.logprobs, rollouts.logprobs[i], atol=2e-6)
    assert float(one_metrics["advantage_abs_mean"]) > 0  # rewards did differ in groups
    moved = 0.0
    for a, b, before in zip(jax.tree.leaves(new_state.params),
                            jax.tree.leaves(new_states.params),
                            jax.tree.leaves(states[i].params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b[i]), atol=1e-6)
      moved = max(moved, float(jnp.max(jnp.abs(a - before))))
    assert moved > 1e-4  # the update did move the params
    for k in ("loss", "kl", "entropy", "clip_frac", "advantage_abs_mean"):
      np.testing.assert_allclose(one_metrics[k], metrics[k][i], rtol=1e-4, atol=1e-7)
    assert int(new_states.step[i]) == int(new_state.step) == 1
  # The slot-refill engine vmapped over the seeds (its loops and refill branch batched): each
  # seed's tokens are its single-seed static ones.
  refilled = axis.compile(lambda p, t, m, k: generate(p, t, m, k, decode_slots=5, **common))(
      stacked.params, axis.stack(tokens), axis.stack(masks), axis.stack(keys))
  for i, (rollout, _, _) in enumerate(single):
    np.testing.assert_array_equal(rollout.completion_tokens, refilled.completion_tokens[i])
    np.testing.assert_array_equal(rollout.completion_mask, refilled.completion_mask[i])


@pytest.mark.slow
def test_stacked_seeds_resume_from_their_checkpoint(tmp_path,
                                                    first_token_parity_reward):
  """A stacked run stopped after step 2 and resumed equals one that ran through. The parity
  reward (conftest) gives a random policy's groups a spread, so every step moves the params
  and the Adam moments that the checkpoint must hold (the task's reward gave every sample 0
  here: no update moved anything). No warm-up, and greedy evaluation alone: that a resume
  skips the warm-up is
  tests/test_checkpoint.py::test_sigkill_then_resume_reproduces_the_uninterrupted_run's
  claim (the same code for stacked seeds); the evaluation keys come from the seeds, not the
  checkpoint, and the stacked pass@k with its per-seed keys is
  test_seeds_in_one_program_equal_separate_runs_bit_for_bit's claim."""
  config = _small_config(steps=4)
  config.warmup.steps = 0
  config.train.eval_pass_k = 0
  config.reward.name = first_token_parity_reward
  config.train.checkpoint_every = 2
  seeds = [0, 1]
  train(config, str(tmp_path / "through"), log=quiet, seeds=seeds)
  short = config.copy_and_resolve_references()
  short.train.steps = 2
  train(short, str(tmp_path / "resumed"), log=quiet, seeds=seeds)
  lines = []
  train(config, str(tmp_path / "resumed"), log=lines.append, seeds=seeds)
  assert any("resumed from checkpoint" in line and line.rstrip().endswith("/2 (no warm-up)")
             for line in lines), lines
  for s in seeds:
    through = _records(tmp_path / "through" / f"seed_{s}" / "metrics.jsonl")
    resumed = _records(tmp_path / "resumed" / f"seed_{s}" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert resumed == through
    assert through[-1]["kl"] > 0, through  # the updates moved the params off the reference


def test_what_one_program_cannot_run_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="give distinct seeds"):
    SeedAxis((0, 0), "vmap")
  with pytest.raises(ConfigError, match="valid: vmap, map"):
    SeedAxis((0, 1), "pmap")
  config = _small_config()
  config.distributed.mode = "explicit"
  with pytest.raises(ConfigError, match="stacked seeds run in one process"):
    train(config, str(tmp_path), log=quiet, seeds=[0, 1])


def test_a_seed_folder_in_use_stops_the_stacked_run(tmp_path):
  """Stacked seeds lock each seed's folder too: while a run of seed 1 alone holds
  workdir/seed_1 (its --workdir), the stacked run stops in one sentence naming that folder
  and writes no record (both runs would have written that folder's metrics.jsonl, and each
  start trims it to its own checkpoint)."""
  import os  # noqa: PLC0415

  from grpo_jax.train.run.workdir import WorkdirBusy, WorkdirLock  # noqa: PLC0415
  workdir = tmp_path / "seeds"
  alone = workdir / "seed_1"
  with WorkdirLock(str(alone)):
    with pytest.raises(WorkdirBusy, match=f"^the workdir {alone} is in use by another run "
                                          f"\\(PID {os.getpid()}\\)"):
      train(_small_config(steps=1), str(workdir), log=quiet, seeds=[0, 1])
  assert sorted(os.listdir(alone)) == [".lock"]
  assert not (workdir / "seed_0" / "metrics.jsonl").exists()
  with WorkdirLock(str(alone)):  # the stacked run's locks were released
    pass


def test_stacked_seeds_export_and_log_to_w_and_b_each_in_its_own_folder(tmp_path, monkeypatch):
  """train.export writes each seed's policy to seed_<s>/hf_export, and train.wandb_project
  gives each seed its own W&B run (its seed_<s>/wandb_run_id), all in one process."""
  wandb = pytest.importorskip("wandb")
  from grpo_jax.models.hf import load_hf_checkpoint  # noqa: PLC0415
  logged = []
  original = wandb.sdk.wandb_run.Run.log

  def log(self, data, step=None, **kwargs):
    logged.append((self.id, step))
    return original(self, data, step=step, **kwargs)

  monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", log)
  config = _small_config(steps=1)
  config.warmup.steps, config.train.num_samples = 0, 0
  config.train.eval_size = config.train.eval_batch_size = 8
  config.rl.num_iterations = config.rl.num_minibatches = 1
  config.train.export = True
  config.train.wandb_project, config.train.wandb_mode = "grpo_jax_test", "offline"
  state = train(config, str(tmp_path), log=quiet, seeds=[0, 1])
  for i, params in enumerate(SeedAxis((0, 1), "vmap").unstack(state.train.params)):
    _, exported = load_hf_checkpoint(tmp_path / f"seed_{i}" / "hf_export")
    jax.tree.map(np.testing.assert_array_equal, exported, jax.device_get(params))
  ids = [(tmp_path / f"seed_{s}" / "wandb_run_id").read_text() for s in (0, 1)]
  assert sorted(logged) == sorted((i, step) for i in ids for step in (0, 1))
