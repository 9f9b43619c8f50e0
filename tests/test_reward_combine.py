"""Combining several rewards (grpo_jax/rewards/combine.py) against NumPy / plain-loop references,
GDPO's batch normalisation included."""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rewards.combine import (COMBINE_MODES, batch_normalise, combine_rewards,
                                      component_means)


def _components(seed, group, prompts=4, count=3):
  """Column 0 binary (some groups with no spread), 1 continuous, 2 on a large scale."""
  rng = np.random.default_rng(seed)
  rows = prompts * group
  c = np.stack([rng.integers(0, 2, rows), rng.normal(size=rows),
                rng.normal(50.0, 20.0, size=rows)], axis=1)[:, :count].astype(np.float32)
  c[:group, 0] = 1.0  # group 0: reward 0 all correct
  c[group:2 * group, 0] = 0.0  # group 1: all wrong
  c[2 * group:3 * group, 1] = -0.25  # group 2: reward 1 constant
  weights = rng.uniform(0.1, 2.0, size=count).astype(np.float32)
  return c, weights


def _reference(c, weights, group, mode, eps):
  out = []
  for b in range(c.shape[0]):
    start = b - b % group
    total = 0.0
    for r in range(c.shape[1]):
      value = float(c[b, r])
      if mode == "normalise_then_sum":
        block = [float(x) for x in c[start:start + group, r]]
        value = (value - statistics.mean(block)) / (statistics.stdev(block) + eps)
      total += float(weights[r]) * value
    out.append(total)
  return np.array(out)


@pytest.mark.parametrize("mode", COMBINE_MODES)
@pytest.mark.parametrize("seed,group", [(0, 2), (1, 4), (2, 8)])
def test_combine_matches_loop(seed, group, mode):
  c, weights = _components(seed, group)
  got = np.asarray(combine_rewards(c, weights, group, mode, eps=1e-4))
  assert got.dtype == np.float32 and got.shape == (c.shape[0],)
  np.testing.assert_allclose(got, _reference(c, weights, group, mode, 1e-4), rtol=1e-5,
                             atol=1e-5)


def test_no_spread_adds_exactly_zero_and_no_nan():
  c, weights = _components(3, 4)
  c[:4] = 7.0  # group 0: every reward constant
  got = np.asarray(combine_rewards(c, weights, 4, "normalise_then_sum"))
  assert np.all(np.isfinite(got)) and np.all(got[:4] == 0.0)
  only = np.asarray(combine_rewards(c[:, :1], weights[:1], 4, "normalise_then_sum"))
  assert np.all(only[:8] == 0.0)  # reward 0 has no spread in groups 0 and 1


def test_weights_scale_each_component():
  c, _ = _components(4, 4)
  for mode in COMBINE_MODES:
    parts = [np.asarray(combine_rewards(c, np.eye(3, dtype=np.float32)[r], 4, mode))
             for r in range(3)]
    weights = np.array([2.0, -0.5, 0.0], np.float32)
    got = np.asarray(combine_rewards(c, weights, 4, mode))
    np.testing.assert_allclose(got, sum(w * p for w, p in zip(weights, parts)), rtol=1e-5,
                               atol=1e-5)
  np.testing.assert_allclose(combine_rewards(c, np.ones(3, np.float32), 4, "sum"), c.sum(1),
                             rtol=1e-6)


def test_normalise_then_sum_is_invariant_to_each_rewards_scale_and_shift():
  rng = np.random.default_rng(5)
  c, weights = rng.normal(size=(16, 3)).astype(np.float32), np.ones(3, np.float32)
  moved = c * np.array([3.0, 0.1, 10.0], np.float32) + np.array([1.0, -2.0, 5.0], np.float32)
  got = np.asarray(combine_rewards(moved, weights, 4, "normalise_then_sum", eps=0.0))
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, combine_rewards(c, weights, 4, "normalise_then_sum", eps=0.0),
                             rtol=1e-4, atol=1e-4)


def test_gdpo_reproduced_with_batch_normalise():
  """GDPO's official TRL advantage (NVlabs/GDPO), transcribed to NumPy: per-reward group
  normalisation (torch .std(): n-1, + 1e-4), weighted sum, then batch mean/std (n-1, + 1e-4)."""
  c, weights = _components(6, 8)
  per_reward = []
  for r in range(c.shape[1]):
    groups = c[:, r].astype(np.float64).reshape(-1, 8)
    normed = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, ddof=1, keepdims=True)
                                                         + 1e-4)
    per_reward.append(normed.reshape(-1))
  pre = (np.stack(per_reward, 1) * weights[None, :]).sum(1)
  want = (pre - pre.mean()) / (pre.std(ddof=1) + 1e-4)
  got = batch_normalise(combine_rewards(c, weights, 8, "normalise_then_sum", eps=1e-4), eps=1e-4)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_batch_normalise_matches_numpy():
  x = np.random.default_rng(8).normal(3.0, 2.0, size=20).astype(np.float32)
  want = (x - x.mean()) / (x.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(batch_normalise(x), want, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(batch_normalise(np.full(6, 2.0, np.float32))) == 0.0)


def test_jit_equals_eager():
  c, weights = _components(9, 4)
  for mode in COMBINE_MODES:
    jitted = jax.jit(combine_rewards, static_argnums=(2, 3))(c, weights, 4, mode)
    np.testing.assert_allclose(jitted, combine_rewards(c, weights, 4, mode), rtol=1e-6,
                               atol=1e-6)
  np.testing.assert_allclose(jax.jit(batch_normalise)(c[:, 1]), batch_normalise(c[:, 1]),
                             rtol=1e-6, atol=1e-6)


def test_component_means_keys_and_values():
  c, _ = _components(10, 4)
  got = component_means(jnp.asarray(c), ("rule", "rm0", "remote0"))
  assert list(got) == ["reward/rule_mean", "reward/rm0_mean", "reward/remote0_mean"]
  for value, column in zip(got.values(), c.T):
    assert isinstance(value, float) and value == pytest.approx(float(np.mean(column)), rel=1e-6)
  with pytest.raises(ValueError, match="do not match 2 reward names"):
    component_means(c, ("a", "b"))


def test_bad_inputs_raise_one_sentence():
  c, weights = _components(11, 4)
  with pytest.raises(ValueError, match="Unknown reward combination 'mean'"):
    combine_rewards(c, weights, 4, "mean")
  with pytest.raises(ValueError, match="weights has shape"):
    combine_rewards(c, weights[:2], 4, "sum")
  with pytest.raises(ValueError, match="components must be"):
    combine_rewards(c[:, 0], weights, 4, "sum")
  with pytest.raises(ValueError, match="cannot be split into groups of 3"):
    combine_rewards(c, weights, 3, "normalise_then_sum")
  with pytest.raises(ValueError, match="use group_size >= 2"):
    combine_rewards(c, weights, 1, "normalise_then_sum")
  with pytest.raises(ValueError, match="use B >= 2"):
    batch_normalise(np.ones(1, np.float32))
  np.testing.assert_allclose(combine_rewards(c, weights, 1, "sum"), c @ weights, rtol=1e-5)


def test_gdpo_is_normalise_then_sum_with_the_grpo_batch_std_estimator():
  """docs/rewards.md's claim ("Several rewards"): rl.advantage='grpo_batch_std' on the
  normalise-then-sum reward is GDPO's batch normalisation (the normalised sum has group mean
  0)."""
  from grpo_jax.rl.advantages import grpo_batch_std_advantages
  rng = np.random.default_rng(3)
  components = jnp.asarray(rng.integers(0, 3, (24, 3)).astype(np.float32))
  weights = jnp.asarray([1.0, 0.5, 2.0])
  combined = combine_rewards(components, weights, 4, "normalise_then_sum")
  mask = jnp.ones((24, 5), bool)
  ours = grpo_batch_std_advantages(combined, 4, mask, 1e-6)[:, 0]
  np.testing.assert_allclose(np.asarray(ours), np.asarray(batch_normalise(combined, 1e-6)),
                             atol=1e-5)
