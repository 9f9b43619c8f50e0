"""The extended RL maths (advantages, KL, policy/value losses, aggregation) against independent
NumPy float64 / plain-loop references on random batches with ragged masks."""

import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import advantages as adv_lib
from grpo_jax.rl import kl as kl_lib
from grpo_jax.rl import losses as loss_lib
from grpo_jax.rl import token_advantages as tok_lib

RNG = np.random.default_rng(0)
B, T, G = 16, 7, 4
f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731


@pytest.fixture(autouse=True)
def _seed_per_test(request):
  """Each test draws the same batch whether run alone or with the others."""
  global RNG
  RNG = np.random.default_rng(zlib.crc32(request.node.name.encode())
                              + int(os.environ.get("RL_SUITE_SEED", "0")))


def _mask(batch=B, length=T, empty_row=False, holes=False):
  """Ragged prefix masks (one row full), optionally one empty row and random holes."""
  lengths = RNG.integers(1, length + 1, size=batch)
  lengths[RNG.integers(batch)] = length
  mask = np.arange(length)[None, :] < lengths[:, None]
  if empty_row:
    mask[RNG.integers(batch)] = False
  if holes:
    mask &= RNG.random((batch, length)) > 0.25
  return mask


def _close(got, want, rtol=1e-6, atol=1e-6):
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


def _np_whiten(x, mask, shift_mean=True, eps=1e-8):
  vals = x[mask].astype(np.float64)
  mean = vals.mean()
  std = np.sqrt(((vals - mean) ** 2).sum() / (len(vals) - 1))
  out = (x - mean) / (std + eps) + (0.0 if shift_mean else mean)
  return np.where(mask, out, 0.0)


def test_grpo_batch_std_rloo_remax_match_loops():
  rewards = RNG.normal(size=B).astype(np.float32)
  greedy = RNG.normal(size=B).astype(np.float32)
  mask = _mask()
  r = [float(x) for x in rewards]
  mean_all = sum(r) / B
  std_all = (sum((x - mean_all) ** 2 for x in r) / (B - 1)) ** 0.5
  batch_std, rloo, remax = (np.zeros((B, T)) for _ in range(3))
  for i in range(B):
    group = r[i // G * G:(i // G + 1) * G]
    for t in range(T):
      if mask[i, t]:
        batch_std[i, t] = (r[i] - sum(group) / G) / (std_all + 1e-3)
        rloo[i, t] = r[i] - (sum(group) - r[i]) / (G - 1)
        remax[i, t] = r[i] - float(greedy[i])
  m = jnp.asarray(mask)
  _close(adv_lib.grpo_batch_std_advantages(f32(rewards), G, m, 1e-3), batch_std)
  _close(adv_lib.rloo_advantages(f32(rewards), G, m), rloo)
  _close(adv_lib.remax_advantages(f32(rewards), f32(greedy), m), remax)
  with pytest.raises(ValueError, match="group_size >= 2"):
    adv_lib.rloo_advantages(f32(rewards), 1, m)
  with pytest.raises(ValueError, match="groups of 5"):
    adv_lib.rloo_advantages(f32(rewards), 5, m)
  with pytest.raises(ValueError, match="shape"):
    adv_lib.remax_advantages(f32(rewards), f32(greedy[:-1]), m)


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_and_reinforce_pp_baseline(shift_mean):
  mask = _mask(empty_row=True)
  x = RNG.normal(2.0, 3.0, size=(B, T))
  garbage = np.where(mask, x, np.nan)
  _close(adv_lib.masked_whiten(f32(garbage), jnp.asarray(mask), shift_mean), _np_whiten(
      x, mask, shift_mean), atol=1e-6)
  rewards = RNG.integers(0, 3, size=B).astype(np.float64)
  centred = rewards - np.repeat(rewards.reshape(-1, G).mean(1), G)
  want = _np_whiten(np.where(mask, centred[:, None], 0.0), mask)
  _close(adv_lib.reinforce_pp_baseline_advantages(f32(rewards), G, jnp.asarray(mask)), want)


def test_place_reward_on_last_token():
  mask = _mask(empty_row=True, holes=True)
  rewards = RNG.normal(size=B)
  want = np.zeros((B, T))
  for i in range(B):
    masked_in = [t for t in range(T) if mask[i, t]]
    if masked_in:
      want[i, masked_in[-1]] = rewards[i]
  _close(adv_lib.place_reward_on_last_token(f32(rewards), jnp.asarray(mask)), want)


def _loop_returns_and_gae(r, v, mask, gamma, lam):
  """Per row: walk its masked-in tokens backwards (holes skipped, V after the last = 0)."""
  ret, adv = np.zeros_like(r), np.zeros_like(r)
  for i in range(r.shape[0]):
    g = a = next_v = 0.0
    for t in reversed([t for t in range(r.shape[1]) if mask[i, t]]):
      g = r[i, t] + gamma * g
      a = r[i, t] + gamma * next_v - v[i, t] + gamma * lam * a
      ret[i, t], adv[i, t], next_v = g, a, v[i, t]
  return ret, adv


@pytest.mark.parametrize("holes", [False, True])
def test_reinforce_pp_matches_loop(holes):
  mask = _mask(holes=holes)
  r = RNG.normal(size=(B, T))
  returns, _ = _loop_returns_and_gae(r, r, mask, 0.9, 0.0)
  got = tok_lib.discounted_returns(f32(np.where(mask, r, np.inf)), jnp.asarray(mask), 0.9)
  _close(got, returns, atol=1e-6)
  if not holes:  # prefix masks: the literal sum_{k>=t} gamma^(k-t) r_k
    i, t = np.argwhere(mask)[RNG.integers(mask.sum())]
    literal = sum(0.9 ** (k - t) * r[i, k] for k in range(t, T) if mask[i, k])
    assert float(got[i, t]) == pytest.approx(literal, abs=2e-6)
  got = tok_lib.reinforce_pp_advantages(f32(r), jnp.asarray(mask), 0.9, eps=1e-8)
  _close(got, _np_whiten(returns, mask), atol=1e-6)


def test_gae_gamma_lam_one_is_monte_carlo_minus_value():
  mask = _mask()
  r, v = RNG.normal(size=(B, T)), RNG.normal(size=(B, T))
  adv, ret = tok_lib.gae_advantages(f32(r), f32(v), jnp.asarray(mask), 1.0, 1.0)
  monte_carlo = np.array([[r[i, t:][mask[i, t:]].sum() for t in range(T)] for i in range(B)])
  _close(adv, np.where(mask, monte_carlo - v, 0.0), atol=1e-6)
  _close(ret, np.where(mask, monte_carlo, 0.0), atol=1e-6)


@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_loop(holes):
  mask = _mask(holes=holes)
  r, v = RNG.normal(size=(B, T)), RNG.normal(size=(B, T))
  _, want = _loop_returns_and_gae(r, v, mask, 0.9, 0.8)
  garbage = lambda x: f32(np.where(mask, x, np.nan))  # noqa: E731
  adv, ret = tok_lib.gae_advantages(garbage(r), garbage(v), jnp.asarray(mask), 0.9, 0.8)
  _close(adv, want, atol=1e-6)
  _close(ret, np.where(mask, want + v, 0.0), atol=1e-6)
  white, ret2 = tok_lib.gae_advantages(f32(r), f32(v), jnp.asarray(mask), 0.9, 0.8, whiten=True)
  _close(white, _np_whiten(want, mask), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(ret2), np.asarray(ret))


def test_the_gae_estimator_binds_rl_gamma_and_lam_by_name():
  """rl.gamma is the discount and rl.lam GAE's lambda through the registered estimator (as the
  config binds it), not only in tok_lib.gae_advantages: swapped names change nothing while
  gamma == lam == 1.0, the defaults (benchmarks/mutation_check.py's gae_arguments_swapped)."""
  from grpo_jax.rl.estimators import ESTIMATORS, EstimatorInputs  # noqa: PLC0415
  mask = _mask()
  r, v = RNG.normal(size=(B, T)), RNG.normal(size=(B, T))
  _, want = _loop_returns_and_gae(r, v, mask, 0.9, 0.8)
  gae = ESTIMATORS.bind("gae", {"gamma": 0.9, "lam": 0.8}, ESTIMATORS.get("gae").fn)
  adv, ret = gae(EstimatorInputs(f32(r), jnp.asarray(mask), f32(v), G, {}))
  _close(adv, want, atol=1e-6)
  _close(ret, np.where(mask, want + v, 0.0), atol=1e-6)


def test_process_advantages_match_loop():
  k, eps = 4, 1e-6
  token_mask = _mask()
  step_mask = RNG.random((B, k)) > 0.3
  step_mask[0] = True
  ends = RNG.integers(-1, T + 2, size=(B, k))  # includes ends before 0 and past T
  rewards = RNG.normal(size=(B, k))
  want = np.zeros((B, T))
  for g in range(B // G):
    rows = range(g * G, (g + 1) * G)
    steps = [rewards[i, j] for i in rows for j in range(k) if step_mask[i, j]]
    mean = sum(steps) / len(steps)
    std = (sum((s - mean) ** 2 for s in steps) / (len(steps) - 1)) ** 0.5
    for i in rows:
      for t in range(T):
        if token_mask[i, t]:
          want[i, t] = sum((rewards[i, j] - mean) / (std + eps) for j in range(k)
                           if step_mask[i, j] and ends[i, j] >= t)
  got = tok_lib.process_advantages(f32(np.where(step_mask, rewards, np.nan)), jnp.asarray(ends),
                                   jnp.asarray(step_mask), G, jnp.asarray(token_mask), eps)
  _close(got, want, atol=1e-6)
  assert np.abs(want).max() > 0.5
  with pytest.raises(ValueError, match="integers"):
    tok_lib.process_advantages(f32(rewards), f32(ends), jnp.asarray(step_mask), G,
                               jnp.asarray(token_mask))


def test_kl_estimators_clamps_and_adaptive_coef():
  mask = _mask()
  logp, ref = RNG.normal(-2, 1, size=(B, T)), RNG.normal(-2, 1, size=(B, T))
  logp[0, 0], ref[0, 0], logp[1, 0], ref[1, 0] = 0.0, -30.0, -30.0, 0.0  # |d| = 30 > 20
  d = logp - ref
  m = jnp.asarray(mask)
  for fn, want in [(kl_lib.kl_k1, d), (kl_lib.kl_k2, 0.5 * d ** 2),
                   (kl_lib.kl_k3, np.exp(-d) + d - 1)]:
    _close(fn(f32(logp), f32(ref), m), np.where(mask, want, 0.0), rtol=1e-6)
  dc = np.clip(d, -20, 20)
  k3c = np.clip(np.exp(-dc) + dc - 1, -10, 10)
  for kind, want in [("k1", dc), ("k2", 0.5 * dc ** 2), ("k3", k3c)]:
    _close(kl_lib.kl_penalty(f32(logp), f32(ref), m, kind), np.where(mask, want, 0.0), rtol=1e-6)
  assert float(kl_lib.kl_penalty(f32(logp), f32(ref), m, "k3")[1, 0]) == 10.0
  unclamped = kl_lib.kl_penalty(f32(logp), f32(ref), m, "k3", clamp=None, k3_clamp=None)
  _close(unclamped, np.where(mask, np.exp(-d) + d - 1, 0.0), rtol=1e-6)
  with pytest.raises(ValueError, match="valid: k1, k2, k3"):
    kl_lib.kl_penalty(f32(logp), f32(ref), m, "k4")
  for observed, error in [(0.05, 0.2), (0.0115, 0.15), (0.005, -0.2), (0.0095, -0.05)]:
    got = kl_lib.adaptive_kl_coef(0.1, observed, target=0.01, horizon=1000, n_steps=64)
    assert float(got) == pytest.approx(0.1 * (1 + error * 64 / 1000), rel=1e-6)


def test_ppo_clip_loss_with_dual_clip_matches_loop():
  mask, cl, ch, c = _mask(), 0.2, 0.28, 3.0
  old = RNG.normal(-1.5, 1, size=(B, T))
  logp = old + RNG.normal(scale=0.6, size=(B, T))
  adv = RNG.normal(size=(B, T))
  logp[0, 0], adv[0, 0] = old[0, 0] + 40.0, -abs(adv[0, 0])  # log ratio clamp
  logp[1:5, 0], adv[1:5, 0] = old[1:5, 0] + 1.5, -np.abs(adv[1:5, 0])  # rho = 4.5 > c, A < 0
  want_loss, want_grad = np.zeros((B, T)), np.zeros((B, T))
  want_clip, want_dual = np.zeros((B, T), bool), np.zeros((B, T), bool)
  for i, t in zip(*np.nonzero(mask)):
    log_ratio = min(max(logp[i, t] - old[i, t], -20.0), 20.0)
    rho, a = np.exp(log_ratio), adv[i, t]
    l1, l2 = -rho * a, -min(max(rho, 1 - cl), 1 + ch) * a
    loss, want_clip[i, t] = max(l1, l2), l2 > l1
    grad = 0.0 if (l2 > l1 or abs(log_ratio) == 20.0) else -rho * a
    if a < 0 and -c * a < loss:
      loss, grad, want_dual[i, t] = -c * a, 0.0, True
    want_loss[i, t], want_grad[i, t] = loss, grad
  m = jnp.asarray(mask)
  loss_fn = lambda lp: loss_lib.ppo_clip_loss(lp, f32(old), f32(adv), m, cl, ch, c)  # noqa: E731
  loss, metrics = loss_fn(f32(logp))
  grad = jax.grad(lambda lp: loss_fn(lp)[0].sum())(f32(logp))
  _close(loss, want_loss, rtol=1e-6)
  _close(grad, want_grad, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(metrics["clipped"]), want_clip)
  np.testing.assert_array_equal(np.asarray(metrics["dual_clipped"]), want_dual)
  assert 0 < want_dual.sum() < (mask & (adv < 0)).sum() and 0 < want_clip.sum()
  plain, _ = loss_lib.ppo_clip_loss(f32(logp), f32(old), f32(adv), m, cl, ch)
  np.testing.assert_array_equal(np.asarray(plain > loss), want_dual)  # lowered exactly there
  assert float(plain[0, 0]) == pytest.approx(np.exp(20.0) * -adv[0, 0], rel=1e-6)
  with pytest.raises(ValueError, match="c > 1"):
    loss_lib.ppo_clip_loss(f32(logp), f32(old), f32(adv), m, cl, ch, dual_clip_c=1.0)


def test_gspo_value_and_gradient():
  mask, cl, ch = _mask(), 0.002, 0.003
  old = RNG.normal(-1.5, 1, size=(B, T))
  logp = old + RNG.normal(scale=0.01, size=(B, T))
  adv_row = RNG.normal(size=B)
  adv = np.repeat(adv_row[:, None], T, 1)
  s = np.exp([(logp[i] - old[i])[mask[i]].mean() for i in range(B)])
  want_loss, want_grad = np.zeros((B, T)), np.zeros((B, T))
  for i, t in zip(*np.nonzero(mask)):
    l1, l2 = -s[i] * adv[i, t], -np.clip(s[i], 1 - cl, 1 + ch) * adv[i, t]
    want_loss[i, t] = max(l1, l2)
    want_grad[i, t] = 0.0 if l2 > l1 else -s[i] * adv[i, t]
  m = jnp.asarray(mask)
  per_token = lambda lp: loss_lib.gspo_loss(lp, f32(old), f32(adv), m, cl, ch)[0]  # noqa: E731
  _close(per_token(f32(logp)), want_loss, rtol=1e-6)
  _close(jax.grad(lambda lp: per_token(lp).sum())(f32(logp)), want_grad, rtol=1e-6)
  clipped_rows = np.asarray(loss_lib.gspo_loss(f32(logp), f32(old), f32(adv), m, cl, ch)[1][
      "clipped"]).any(1)
  assert 0 < clipped_rows.sum() < B

  def sequence_gspo(lp):  # the sequence-level objective, ratio fully differentiable
    lengths = jnp.sum(m, axis=1)
    ratio = jnp.exp(jnp.sum(jnp.where(m, lp - f32(old), 0.0), axis=1) / lengths)
    a = f32(adv_row)
    return -jnp.sum(jnp.minimum(ratio * a, jnp.clip(ratio, 1 - cl, 1 + ch) * a)) / B

  token_grad = jax.grad(lambda lp: loss_lib.aggregate(per_token(lp), m, "seq-mean-token-mean"))
  _close(token_grad(f32(logp)), np.asarray(jax.grad(sequence_gspo)(f32(logp))), rtol=1e-6,
         atol=1e-7)


def test_truncated_is_weights_value_loss_entropy():
  mask = _mask()
  m = jnp.asarray(mask)
  old, rollout = RNG.normal(-2, 1, size=(B, T)), RNG.normal(-2, 1, size=(B, T))
  want = np.where(mask, np.minimum(np.exp(old - rollout), 2.0), 0.0)
  _close(loss_lib.truncated_is_weights(f32(old), f32(rollout), m, 2.0), want, rtol=1e-6)
  grad = jax.grad(lambda o: loss_lib.truncated_is_weights(o, f32(rollout), m, 2.0).sum())(f32(old))
  np.testing.assert_array_equal(np.asarray(grad), 0.0)
  v, v_old, ret = (RNG.normal(size=(B, T)) for _ in range(3))
  want_loss, want_clip = np.zeros((B, T)), np.zeros((B, T), bool)
  for i, t in zip(*np.nonzero(mask)):
    vc = min(max(v[i, t], v_old[i, t] - 0.3), v_old[i, t] + 0.3)
    a, b = (v[i, t] - ret[i, t]) ** 2, (vc - ret[i, t]) ** 2
    want_loss[i, t], want_clip[i, t] = 0.5 * max(a, b), b > a
  loss, metrics = loss_lib.value_loss(f32(v), f32(v_old), f32(ret), m, 0.3)
  _close(loss, want_loss)
  np.testing.assert_array_equal(np.asarray(metrics["clipped"]), want_clip)
  assert 0 < want_clip.sum() < mask.sum()
  ent = RNG.random((B, T))
  _close(loss_lib.entropy_bonus(f32(ent), m, 0.01), np.where(mask, -0.01 * ent, 0.0))


def _np_aggregate(x, mask, mode):
  rows = [x[i][mask[i]] for i in range(len(x))]
  if mode == "token-mean":
    return np.concatenate(rows).sum() / mask.sum()
  if mode == "seq-mean-token-mean":
    return sum(r.mean() if len(r) else 0.0 for r in rows) / len(rows)
  total = sum(r.sum() for r in rows)
  return total / len(rows) if mode == "seq-mean-token-sum" else total / (len(rows) * x.shape[1])


def _np_aggregate_grad(mask, mode):
  b, t = mask.shape
  per_row = {"token-mean": np.full(b, 1.0 / mask.sum()),
             "seq-mean-token-mean": 1.0 / (b * np.maximum(mask.sum(1), 1)),
             "seq-mean-token-sum": np.full(b, 1.0 / b),
             "seq-mean-token-sum-norm": np.full(b, 1.0 / (b * t))}[mode]
  return np.where(mask, per_row[:, None], 0.0)


@pytest.mark.parametrize("mode", loss_lib.LOSS_AGGREGATIONS)
def test_aggregate_matches_loop_and_is_exact_under_micro_batching(mode):
  mask = _mask(empty_row=True)
  x = RNG.normal(size=(B, T))
  m, per_token = jnp.asarray(mask), f32(np.where(mask, x, np.nan))
  _close(loss_lib.aggregate(per_token, m, mode), _np_aggregate(x, mask, mode))
  full_norm = loss_lib.loss_normalizer(m, mode)
  micro_rows = RNG.permutation(B).reshape(4, -1)

  def accumulated(values):
    return sum(loss_lib.aggregate(values[rows], m[rows], mode, normalizer=full_norm)
               for rows in micro_rows)

  full_value, full_grad = jax.value_and_grad(lambda v: loss_lib.aggregate(v, m, mode))(per_token)
  acc_value, acc_grad = jax.value_and_grad(accumulated)(per_token)
  assert float(acc_value) == pytest.approx(float(full_value), abs=1e-6)
  _close(acc_grad, _np_aggregate_grad(mask, mode), rtol=1e-6, atol=1e-9)
  _close(full_grad, _np_aggregate_grad(mask, mode), rtol=1e-6, atol=1e-9)
  _close(acc_grad, np.asarray(full_grad), rtol=1e-6, atol=0.0)
  own = loss_lib.aggregate(per_token[micro_rows[0]], m[micro_rows[0]], mode)
  _close(own, _np_aggregate(x[micro_rows[0]], mask[micro_rows[0]], mode))


def test_aggregation_modes_and_errors():
  assert loss_lib.LOSS_AGGREGATIONS == ("token-mean", "seq-mean-token-mean",
                                        "seq-mean-token-sum", "seq-mean-token-sum-norm")
  mask = jnp.asarray(_mask())
  with pytest.raises(ValueError, match="valid: token-mean"):
    loss_lib.aggregate(jnp.zeros((B, T)), mask, "token-sum")
  with pytest.raises(ValueError, match="shape"):
    loss_lib.aggregate(jnp.zeros((B, T + 1)), mask, "token-mean")
  assert float(loss_lib.loss_normalizer(mask, "seq-mean-token-sum-norm")) == B * T


def test_garbage_at_masked_positions_changes_nothing():
  """inf/nan at masked positions change no output and no gradient of any per-token function."""
  mask = _mask(empty_row=True)
  m = jnp.asarray(mask)
  xs = [f32(RNG.normal(-1.5, 0.5, size=(B, T))) for _ in range(3)]
  fns = {
      "ppo": lambda a, b, c: loss_lib.ppo_clip_loss(a, b, c, m, 0.2, 0.2, 3.0)[0],
      "gspo": lambda a, b, c: loss_lib.gspo_loss(a, b, c, m, 0.2, 0.2)[0],
      "value": lambda a, b, c: loss_lib.value_loss(a, b, c, m, 0.2)[0],
      "tis": lambda a, b, c: loss_lib.truncated_is_weights(a, b, m, 2.0) * kl_lib.kl_k1(c, b, m),
      "k3": lambda a, b, c: kl_lib.kl_penalty(a, b, m, "k3") + kl_lib.kl_k2(a, c, m),
      "gae": lambda a, b, c: tok_lib.gae_advantages(a, b, m, 0.9, 0.8, whiten=True)[0],
      "rpp": lambda a, b, c: tok_lib.reinforce_pp_advantages(a, m, 0.9) * kl_lib.kl_k1(c, b, m),
      "whiten": lambda a, b, c: adv_lib.masked_whiten(a, m) + adv_lib.masked_whiten(b, m, False),
  }
  noisy = [jnp.where(m, x, v) for x, v in zip(xs, (jnp.nan, -jnp.inf, jnp.inf))]
  weights = f32(RNG.normal(size=(B, T)))
  for name, fn in fns.items():
    for mode in ("token-mean", "seq-mean-token-mean"):
      scalar = lambda *a: loss_lib.aggregate(fn(*a) * weights, m, mode)  # noqa: E731
      base, grads = jax.value_and_grad(scalar, argnums=(0, 1, 2))(*xs)
      dirty, dirty_grads = jax.value_and_grad(scalar, argnums=(0, 1, 2))(*noisy)
      assert float(dirty) == float(base) and np.isfinite(float(base)), name
      for g, dg in zip(grads, dirty_grads):
        np.testing.assert_array_equal(np.asarray(dg), np.asarray(g), err_msg=name)
        assert np.all(np.asarray(g)[~mask] == 0.0), name
    out = np.asarray(fn(*noisy))
    assert np.all(out[~mask] == 0.0) and np.all(np.isfinite(out)), name
