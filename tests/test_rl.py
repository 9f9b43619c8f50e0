"""The RL maths against independent NumPy / plain-loop references, masks included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl.advantages import broadcast_to_tokens, group_normalized_advantages
from grpo_jax.rl.kl import kl_k3
from grpo_jax.rl.losses import aggregate, clipped_surrogate

RNG = np.random.default_rng(0)


def _ragged_mask(batch, length, rng=RNG):
  lengths = rng.integers(1, length + 1, size=batch)
  return np.arange(length)[None, :] < lengths[:, None]


@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_group_normalized_advantages_match_loop(group_size):
  rewards = RNG.integers(0, 2, size=6 * group_size).astype(np.float32)
  rewards[:group_size] = 1.0  # one group with zero spread
  eps = 1e-4
  got = np.asarray(group_normalized_advantages(jnp.asarray(rewards), group_size, eps))
  for g in range(6):
    block = [float(x) for x in rewards[g * group_size:(g + 1) * group_size]]
    mean = sum(block) / group_size
    std = (sum((x - mean) ** 2 for x in block) / (group_size - 1)) ** 0.5
    for i, r in enumerate(block):
      assert got[g * group_size + i] == pytest.approx((r - mean) / (std + eps), abs=1e-6)
  np.testing.assert_array_equal(got[:group_size], 0.0)
  centred = np.asarray(group_normalized_advantages(jnp.asarray(rewards), group_size,
                                                   scale_by_std=False))
  np.testing.assert_allclose(
      centred, rewards - np.repeat(rewards.reshape(-1, group_size).mean(1), group_size),
      atol=1e-6)


def test_advantages_reject_bad_shapes():
  with pytest.raises(ValueError, match="groups of 4"):
    group_normalized_advantages(jnp.zeros(6), 4)
  with pytest.raises(ValueError, match="group_size=1"):
    group_normalized_advantages(jnp.zeros(6), 1)


def test_broadcast_to_tokens_zeroes_padding():
  mask = _ragged_mask(5, 7)
  values = RNG.normal(size=5).astype(np.float32)
  got = np.asarray(broadcast_to_tokens(jnp.asarray(values), jnp.asarray(mask)))
  np.testing.assert_array_equal(got, np.where(mask, values[:, None], 0.0))


def test_k3_matches_numpy_and_is_nonnegative():
  logp = RNG.normal(size=(6, 9)) - 2
  ref = RNG.normal(size=(6, 9)) - 2
  got = np.asarray(kl_k3(jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32)))
  expected = np.exp(ref - logp) - (ref - logp) - 1
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  assert np.all(got >= 0)
  np.testing.assert_array_equal(np.asarray(kl_k3(jnp.ones(3), jnp.ones(3))), 0.0)


def _np_clipped_loss(logp, old, adv, mask, eps, mode):
  per_token = np.zeros_like(logp)
  clipped = np.zeros_like(logp)
  for i in range(logp.shape[0]):
    for t in range(logp.shape[1]):
      ratio = np.exp(logp[i, t] - old[i, t])
      a = ratio * adv[i, t]
      b = min(max(ratio, 1 - eps), 1 + eps) * adv[i, t]
      per_token[i, t] = -min(a, b)
      clipped[i, t] = b < a
  if mode == "token-mean":
    return (per_token * mask).sum() / mask.sum(), (clipped * mask).sum() / mask.sum()
  rows = [(per_token[i] * mask[i]).sum() / mask[i].sum() for i in range(len(mask))]
  return np.mean(rows), (clipped * mask).sum() / mask.sum()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_clipped_surrogate_matches_loop(mode):
  b, n, eps = 8, 6, 0.2
  mask = _ragged_mask(b, n)
  old = RNG.normal(size=(b, n)) - 1.5
  logp = old + RNG.normal(scale=0.4, size=(b, n))  # ratios on both sides of the clip range
  adv = np.repeat(RNG.normal(size=(b, 1)), n, 1) * mask
  m = jnp.asarray(mask)
  per_token, clipped = clipped_surrogate(*(jnp.asarray(x, jnp.float32) for x in (logp, old, adv)),
                                         m, eps, eps)
  loss = float(aggregate(per_token, m, mode))
  clip_frac = float(aggregate(clipped.astype(jnp.float32), m, "token-mean"))
  ref_loss, ref_clip = _np_clipped_loss(logp, old, adv, mask, eps, mode)
  assert loss == pytest.approx(ref_loss, abs=1e-6)
  assert clip_frac == pytest.approx(ref_clip, abs=1e-6)
  assert 0 < ref_clip < 1  # both branches exercised


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_padding_contributes_exactly_nothing(mode):
  """Garbage (even inf/nan) at masked positions changes neither the loss nor its gradient."""
  b, n = 4, 5
  mask = jnp.asarray(_ragged_mask(b, n))
  old = jnp.asarray(RNG.normal(size=(b, n)), jnp.float32)
  ref = jnp.asarray(RNG.normal(size=(b, n)), jnp.float32)
  adv = jnp.asarray(RNG.normal(size=(b, n)), jnp.float32)
  logp = jnp.asarray(RNG.normal(size=(b, n)), jnp.float32)

  def loss_fn(lp, old, ref, adv):
    pg, _ = clipped_surrogate(lp, old, adv, mask, 0.2, 0.2)
    return aggregate(pg + 0.04 * kl_k3(lp, ref, mask), mask, mode)

  garbage = lambda x, v: jnp.where(mask, x, v)  # noqa: E731
  base, grad = jax.value_and_grad(loss_fn)(logp, old, ref, adv)
  noisy, noisy_grad = jax.value_and_grad(loss_fn)(
      garbage(logp, 50.0), garbage(old, -jnp.inf), garbage(ref, jnp.nan), garbage(adv, 1e9))
  assert float(noisy) == float(base)
  np.testing.assert_array_equal(np.asarray(noisy_grad), np.asarray(grad))
  assert np.all(np.asarray(grad)[~np.asarray(mask)] == 0.0)


@pytest.mark.parametrize("value,group", [(0.7, 8), (0.1, 3)])
def test_tied_groups_have_exactly_zero_advantage_in_every_group_estimator(value, group):
  """A batch whose groups are each tied (every reward of a group equal) carries no signal:
  every group estimator gives it exactly 0, so the gradient is 0 and skip_without_signal
  leaves the policy where it was. The plain formula did not: a group's mean rounds (XLA: 8 x
  0.7 sum to 5.6000004, then times 1/8), and divided by a standard deviation of 0 + eps that
  became an advantage of 0.056 on every row (TRL's torch arithmetic gives the same 0.056)."""
  from grpo_jax.rewards.combine import combine_rewards  # noqa: PLC0415
  from grpo_jax.rl import advantages as adv  # noqa: PLC0415
  from grpo_jax.rl.gfpo import gfpo_advantages  # noqa: PLC0415
  from grpo_jax.rl.token_advantages import process_advantages  # noqa: PLC0415
  r = jnp.asarray(np.repeat(np.float32([value, 3 * value]), group))
  mask, rows = jnp.ones((2 * group, 3), bool), 2 * group
  outputs = {
      "grpo": adv.group_normalized_advantages(r, group),
      "dr_grpo": adv.group_normalized_advantages(r, group, scale_by_std=False),
      "grpo_batch_std": adv.grpo_batch_std_advantages(r, group, mask),
      "rloo": adv.rloo_advantages(r, group, mask),
      "reinforce_pp_baseline": adv.reinforce_pp_baseline_advantages(r, group, mask),
      "gfpo": gfpo_advantages(r, jnp.ones(rows, bool), group),
      "process": process_advantages(r[:, None], jnp.full((rows, 1), 2), jnp.ones((rows, 1), bool),
                                    group, mask),
      "normalise_then_sum": combine_rewards(r[:, None], jnp.ones(1), group,
                                            "normalise_then_sum")}
  for name, out in outputs.items():
    assert np.all(np.asarray(out) == 0.0), (name, out)
