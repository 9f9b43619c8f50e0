"""GFPO (grpo_jax/rl/gfpo.py) against plain-Python references: which rows are kept, their
indices, and the advantages over the kept set."""

import statistics
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl.advantages import group_normalized_advantages
from grpo_jax.rl.gfpo import GFPO_METRICS, gfpo_advantages, gfpo_keep_mask, gfpo_kept_rows

CASES = [(seed, group, keep) for seed in range(4) for group, keep in ((4, 1), (4, 3), (8, 4),
                                                                       (8, 8))]


def _batch(seed, group, prompts=5):
  """Rewards from a few dyadic values (exact in float32) and short lengths, so ties in length,
  in reward and in reward / length all occur; some lengths are 0."""
  rng = np.random.default_rng(seed)
  rewards = rng.choice([-1.0, 0.0, 0.5, 1.0, 2.0], size=prompts * group).astype(np.float32)
  lengths = rng.integers(0, 7, size=prompts * group).astype(np.int32)
  return rewards, lengths


def _reference_mask(rewards, lengths, group, keep, metric):
  """Sort each group's rows by (metric, row), exactly (Fractions), and keep the first `keep`."""
  mask = [False] * len(rewards)
  for start in range(0, len(rewards), group):
    rows = range(start, start + group)
    if metric == "length":
      cost = {i: int(lengths[i]) for i in rows}
    else:
      cost = {i: -Fraction(float(rewards[i])) / max(int(lengths[i]), 1) for i in rows}
    for i in sorted(rows, key=lambda i: (cost[i], i))[:keep]:
      mask[i] = True
  return np.array(mask)


def _reference_advantages(rewards, mask, group, eps, scale):
  out = [0.0] * len(rewards)
  for start in range(0, len(rewards), group):
    kept = [i for i in range(start, start + group) if mask[i]]
    values = [float(rewards[i]) for i in kept]
    mean = sum(values) / len(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    for i, v in zip(kept, values):
      out[i] = (v - mean) / (std + eps) if scale else v - mean
  return np.array(out)


@pytest.mark.parametrize("metric", GFPO_METRICS)
@pytest.mark.parametrize("seed,group,keep", CASES)
def test_keep_mask_matches_reference(seed, group, keep, metric):
  rewards, lengths = _batch(seed, group)
  got = np.asarray(gfpo_keep_mask(rewards, lengths, group, keep, metric))
  assert got.dtype == bool
  np.testing.assert_array_equal(got, _reference_mask(rewards, lengths, group, keep, metric))
  np.testing.assert_array_equal(got.reshape(-1, group).sum(1), keep)


def test_token_efficiency_on_continuous_rewards():
  rng = np.random.default_rng(7)
  rewards = rng.normal(size=48).astype(np.float32)
  lengths = rng.integers(1, 200, size=48).astype(np.int32)
  got = np.asarray(gfpo_keep_mask(rewards, lengths, 8, 3, "token_efficiency"))
  for g in range(6):
    efficiency = rewards[g * 8:(g + 1) * 8] / lengths[g * 8:(g + 1) * 8]
    best = set(np.argsort(-efficiency, kind="stable")[:3])
    assert set(np.flatnonzero(got[g * 8:(g + 1) * 8])) == best


def test_length_keeps_exactly_the_shortest():
  group, keep, prompts = 8, 3, 6
  rng = np.random.default_rng(1)
  lengths = np.concatenate([rng.permutation(group) * 10 + 5 for _ in range(prompts)])
  rewards = rng.normal(size=group * prompts).astype(np.float32)
  mask = np.asarray(gfpo_keep_mask(rewards, lengths.astype(np.int32), group, keep, "length"))
  rows = np.asarray(gfpo_kept_rows(mask, group, keep))
  for g in range(prompts):
    block = lengths[g * group:(g + 1) * group]
    shortest = sorted(g * group + i for i in np.argsort(block)[:keep])
    assert list(rows[g * keep:(g + 1) * keep]) == shortest
    assert sorted(lengths[shortest]) == sorted(block)[:keep]


def test_ties_go_to_the_lower_row():
  lengths = np.array([3, 1, 3, 3, 1, 2, 2, 2], np.int32)
  mask = np.asarray(gfpo_keep_mask(np.ones(8, np.float32), lengths, 4, 2, "length"))
  np.testing.assert_array_equal(mask, [True, True, False, False, True, True, False, False])
  rewards = np.array([0.0, 1.0, 2.0, 2.0, 3.0, 1.0, 2.0, 3.0], np.float32)
  lengths = np.array([3, 1, 2, 2, 0, 1, 2, 3], np.int32)  # efficiency 0 1 1 1 | 3 1 1 1
  mask = np.asarray(gfpo_keep_mask(rewards, lengths, 4, 2, "token_efficiency"))
  np.testing.assert_array_equal(mask, [False, True, True, False, True, True, False, False])


@pytest.mark.parametrize("seed,group,keep", CASES)
def test_kept_rows_match_reference(seed, group, keep):
  rewards, lengths = _batch(seed, group)
  mask = np.asarray(gfpo_keep_mask(rewards, lengths, group, keep, "token_efficiency"))
  got = np.asarray(gfpo_kept_rows(mask, group, keep))
  assert got.dtype == np.int32 and got.shape == (len(rewards) // group * keep,)
  assert list(got) == [i for i in range(len(rewards)) if mask[i]]


def test_kept_rows_with_too_few_true_fill_with_rejected_rows_in_order():
  mask = np.array([False, True, False, False, True, True, True, False])
  np.testing.assert_array_equal(gfpo_kept_rows(mask, 4, 2), [1, 0, 4, 5])


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("seed,group,keep", CASES)
def test_advantages_match_reference(seed, group, keep, scale):
  rng = np.random.default_rng(100 + seed)
  rewards = rng.normal(size=5 * group).astype(np.float32)
  rewards[:group] = 0.5  # a group with no spread: A = 0 on it
  lengths = rng.integers(1, 50, size=5 * group).astype(np.int32)
  mask = np.asarray(gfpo_keep_mask(rewards, lengths, group, keep, "length"))
  got = np.asarray(gfpo_advantages(rewards, mask, group, eps=1e-4, scale=scale))
  assert got.dtype == np.float32
  want = _reference_advantages(rewards, mask, group, 1e-4, scale)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(got[~mask] == 0.0) and np.all(got[:group] == 0.0)


@pytest.mark.parametrize("metric", GFPO_METRICS)
@pytest.mark.parametrize("group,keep", [(4, 2), (8, 3)])
def test_kept_advantages_equal_group_normalised_advantages_of_kept_rows(group, keep, metric):
  rng = np.random.default_rng(group * 10 + keep)
  rewards = rng.integers(0, 3, size=6 * group).astype(np.float32)
  lengths = rng.integers(1, 9, size=6 * group).astype(np.int32)
  mask = gfpo_keep_mask(rewards, lengths, group, keep, metric)
  rows = np.asarray(gfpo_kept_rows(mask, group, keep))
  got = np.asarray(gfpo_advantages(rewards, mask, group))[rows]
  want = np.asarray(group_normalized_advantages(jnp.asarray(rewards[rows]), keep))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_rejected_rows_reach_neither_value_nor_gradient():
  rewards = np.array([1.0, np.nan, 0.0, np.inf, 2.0, 0.0, -np.inf, 1.0], np.float32)
  mask = np.array([True, False, True, False, True, True, False, False])
  value, grad = jax.value_and_grad(lambda r: jnp.sum(gfpo_advantages(r, mask, 4) ** 2))(
      jnp.asarray(rewards))
  assert np.isfinite(value) and np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0)


def test_jit_equals_eager():
  rewards, lengths = _batch(3, 8)
  for metric in GFPO_METRICS:
    eager = gfpo_keep_mask(rewards, lengths, 8, 3, metric)
    jitted = jax.jit(gfpo_keep_mask, static_argnums=(2, 3, 4))(rewards, lengths, 8, 3, metric)
    np.testing.assert_array_equal(eager, jitted)
  rows = jax.jit(gfpo_kept_rows, static_argnums=(1, 2))(eager, 8, 3)
  np.testing.assert_array_equal(rows, gfpo_kept_rows(eager, 8, 3))
  adv = jax.jit(gfpo_advantages, static_argnums=(2,))(rewards, eager, 8)
  np.testing.assert_allclose(adv, gfpo_advantages(rewards, eager, 8), rtol=1e-6, atol=1e-6)


def test_bad_inputs_raise_one_sentence():
  rewards, lengths = np.zeros(8, np.float32), np.ones(8, np.int32)
  with pytest.raises(ValueError, match="keep=0 must be between 1 and group_size=4"):
    gfpo_keep_mask(rewards, lengths, 4, 0, "length")
  with pytest.raises(ValueError, match="keep=5 must be between 1 and group_size=4"):
    gfpo_keep_mask(rewards, lengths, 4, 5, "length")
  with pytest.raises(ValueError, match="keep=5"):
    gfpo_kept_rows(np.ones(8, bool), 4, 5)
  with pytest.raises(ValueError, match="cannot be split into groups of 3"):
    gfpo_keep_mask(rewards, lengths, 3, 1, "length")
  with pytest.raises(ValueError, match="cannot be split into groups of 3"):
    gfpo_kept_rows(np.ones(8, bool), 3, 1)
  with pytest.raises(ValueError, match="cannot be split into groups of 3"):
    gfpo_advantages(rewards, np.ones(8, bool), 3)
  with pytest.raises(ValueError, match="Unknown GFPO metric 'shortest'"):
    gfpo_keep_mask(rewards, lengths, 4, 2, "shortest")
  with pytest.raises(ValueError, match="lengths has shape"):
    gfpo_keep_mask(rewards, lengths[:4], 4, 2, "length")
  with pytest.raises(ValueError, match="keep_mask has shape"):
    gfpo_advantages(rewards, np.ones(4, bool), 4)


def test_the_warm_up_check_counts_the_rows_gfpo_keeps(tmp_path):
  """The warm-up check reads the first batch's kept rows (prompts x rl.gfpo_keep) but split
  them into groups of rollout.group_size: 5 prompts x 3 kept rows of 8 sampled died in
  NumPy's reshape ("cannot reshape array of size 15 into shape (8)")."""
  from configs import grpo_tiny  # noqa: PLC0415
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  config = grpo_tiny.get_config()
  config.warmup.steps, config.train.steps = 2, 1
  config.rl.gfpo_keep, config.rollout.num_prompts = 3, 5
  config.train.update(eval_size=10, eval_batch_size=10)
  lines = []
  train(config, str(tmp_path / "run"), log=lines.append)
  assert any(line.startswith("warm-up check: the first batch's 15 samples (5 prompts x 3)")
             for line in lines), lines
