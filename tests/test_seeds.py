"""S seeds in one program (grpo_jax/train/seeds.py) against S separate runs."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_tiny
from grpo_jax.config import ConfigError
from grpo_jax.rollout.sampler import generate
from grpo_jax.train import seeds as seeds_lib
from grpo_jax.train.experience import RewardInputs, make_prepare_batch
from grpo_jax.train.loop import initial_state, train
from grpo_jax.train.metrics import TIMING_KEYS
from grpo_jax.train.setup import build_model, build_task
from grpo_jax.train.state import make_optimizer
from grpo_jax.train.update import make_update_step

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


@pytest.mark.slow
def test_seeds_in_one_program_equal_separate_runs_bit_for_bit(tmp_path):
  """seed_axis="map": every record of every seed, and the final params, are identical."""
  config = _small_config()
  separate = []
  for s in SEEDS:
    c = config.copy_and_resolve_references()
    c.seed = s
    separate.append(train(c, str(tmp_path / f"run{s}"), log=quiet))
  stacked = seeds_lib.train_seeds(config, SEEDS, str(tmp_path / "seeds"), log=quiet,
                                  seed_axis="map")
  for i, s in enumerate(SEEDS):
    alone = _records(tmp_path / f"run{s}" / "metrics.jsonl")
    together = _records(tmp_path / "seeds" / f"seed_{s}" / "metrics.jsonl")
    assert [r["step"] for r in together] == [0, 1, 2, 3]
    assert together == alone, s
    for a, b in zip(jax.tree.leaves(separate[i].params), jax.tree.leaves(stacked.params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b[i]))
  # The seeds did differ (the comparison above could fail).
  assert _records(tmp_path / "run0" / "metrics.jsonl") != _records(
      tmp_path / "run1" / "metrics.jsonl")


def _one_step_pieces(config):
  """Random policies of 3 seeds, their rollouts' shapes, and the jitted pieces of a step."""
  task = build_task(config, quiet)
  model_cfg = build_model(config, jax.random.key(0))[0]
  optimizer = make_optimizer(config.optim, 100)
  states = []
  for s in SEEDS:
    params = build_model(config, jax.random.fold_in(jax.random.key(s), 0))[1]
    states.append(initial_state(config, model_cfg, params, optimizer, jax.random.key(s)))
  return task, model_cfg, optimizer, states


def test_vmapped_step_matches_single_seed_step_to_float_rounding():
  """seed_axis="vmap": from the same states, the vmapped rollout, batch preparation and
  update give each seed the single-seed tokens exactly and its floats to rounding (XLA
  vectorises a batched reduction differently, so bit equality is not promised)."""
  config = _small_config()
  config.optim.warmup_steps = 1  # a real step size at once
  task, model_cfg, optimizer, states = _one_step_pieces(config)
  r, g = config.rollout, config.rollout.group_size
  common = dict(model_cfg=model_cfg, max_new_tokens=r.max_new_tokens, eos_id=task.eos_id,
                pad_id=task.pad_id, temperature=1.0)
  prompts = [task.train_batch(0, r.num_prompts, s) for s in SEEDS]
  tokens = [np.repeat(p.prompt_tokens, g, 0) for p in prompts]
  masks = [np.repeat(p.prompt_mask, g, 0) for p in prompts]
  keys = [jax.random.key(100 + s) for s in SEEDS]
  rng = np.random.default_rng(0)
  rewards = [rng.integers(0, 2, r.num_prompts * g).astype(np.float32) for _ in SEEDS]

  def inputs(i):
    n = r.num_prompts * g
    zeros = np.zeros((n, r.max_new_tokens), np.float32)
    return RewardInputs(rewards[i], np.zeros(n, np.float32), zeros, zeros.astype(np.int32),
                        zeros.astype(bool))

  prepare = make_prepare_batch(model_cfg, config.rl, g, 1.0, r.max_new_tokens)
  update = make_update_step(model_cfg, config.rl, optimizer, 1.0)
  single = []
  for i in range(len(SEEDS)):
    rollout = generate(states[i].params, tokens[i], masks[i], keys[i], **common)
    batch, _ = prepare(states[i].params, None, states[i].ref_params, states[i].kl_coef,
                       rollout, inputs(i))
    new_state, metrics = update(states[i], batch)
    single.append((rollout, batch, new_state, metrics))

  stacked = seeds_lib.stack(states)
  rollouts = jax.jit(jax.vmap(lambda p, t, m, k: generate(p, t, m, k, **common)))(
      stacked.params, np.stack(tokens), np.stack(masks), seeds_lib.stack(keys))
  batch, _ = jax.jit(jax.vmap(prepare))(stacked.params, None, stacked.ref_params,
                                        stacked.kl_coef, rollouts,
                                        seeds_lib.stack([inputs(i) for i in range(3)]))
  new_states, metrics = jax.jit(jax.vmap(update))(stacked, batch)
  for i, (rollout, one_batch, new_state, one_metrics) in enumerate(single):
    np.testing.assert_array_equal(rollout.completion_tokens, rollouts.completion_tokens[i])
    np.testing.assert_allclose(rollout.logprobs, rollouts.logprobs[i], atol=2e-6)
    np.testing.assert_allclose(one_batch.advantages, batch.advantages[i], atol=1e-6)
    assert float(jnp.abs(one_batch.advantages).sum()) > 0  # rewards did differ in groups
    moved = 0.0
    for a, b, before in zip(jax.tree.leaves(new_state.params),
                            jax.tree.leaves(new_states.params),
                            jax.tree.leaves(states[i].params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b[i]), atol=1e-6)
      moved = max(moved, float(jnp.max(jnp.abs(a - before))))
    assert moved > 1e-4  # the update did move the params
    for k in ("loss", "kl", "entropy", "clip_frac"):
      np.testing.assert_allclose(one_metrics[k], metrics[k][i], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_vmapped_seeds_resume_from_their_checkpoint(tmp_path):
  """A stacked run stopped after step 2 and resumed equals one that ran through."""
  config = _small_config(steps=4)
  config.train.checkpoint_every = 2
  seeds = [0, 1]
  seeds_lib.train_seeds(config, seeds, str(tmp_path / "through"), log=quiet)
  short = config.copy_and_resolve_references()
  short.train.steps = 2
  seeds_lib.train_seeds(short, seeds, str(tmp_path / "resumed"), log=quiet)
  lines = []
  seeds_lib.train_seeds(config, seeds, str(tmp_path / "resumed"), log=lines.append)
  assert any("resumed from checkpoint" in line and line.rstrip().endswith("/2 (no warm-up)")
             for line in lines), lines
  for s in seeds:
    through = _records(tmp_path / "through" / f"seed_{s}" / "metrics.jsonl")
    resumed = _records(tmp_path / "resumed" / f"seed_{s}" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert resumed == through


def test_what_one_program_cannot_run_is_refused():
  config = _small_config()
  with pytest.raises(ConfigError, match="give distinct seeds"):
    seeds_lib.check_vmappable(config, [0, 0])
  config.rl.dynamic_sampling = True
  with pytest.raises(ConfigError, match="dynamic_sampling"):
    seeds_lib.check_vmappable(config, [0, 1])
  with pytest.raises(ConfigError, match="valid: vmap, map"):
    seeds_lib.over_seeds(lambda x: x, "pmap")
