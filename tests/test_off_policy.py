"""DeepSeek-V3.2's off-policy corrections (grpo_jax/rl/off_policy.py) against a NumPy
transcription of the paper's equations (arXiv 2512.02556, section 3.1): eq. (7), the k3 KL
weighted by pi_theta / pi_old, with its gradient; eq. (9), the off-policy sequence mask, row by
row; eq. (8), the objective with both, through make_objective and the update's config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ConfigError, validate
from grpo_jax.defaults import get_defaults, rl_defaults
from grpo_jax.rl.objective import make_objective
from grpo_jax.rl.off_policy import importance_weighted_kl, off_policy_sequence_mask

B, N = 6, 7


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  logp = np.log(rng.uniform(0.05, 0.95, (B, N)))
  old = logp + rng.normal(0.0, 0.3, (B, N))
  ref = logp + rng.normal(0.0, 0.3, (B, N))
  # rows drift from the policy by different amounts (the sequence KL of eq. (9)), both signs
  offsets = np.array([0.3, -0.1, 0.25, 0.5, 0.1, 0.15])[:, None]
  sampler = logp + offsets + rng.normal(0.0, 0.05, (B, N))
  adv = np.repeat(np.array([-1.0, -0.5, 0.7, -1.2, -0.3, 1.0])[:, None], N, 1)
  lengths = np.array([7, 5, 1, 0, 3, 6])
  mask = np.arange(N)[None, :] < lengths[:, None]
  return logp, old, ref, sampler, adv, mask


def _k3(logp, ref):  # DeepSeekMath eq. (4): pi_ref/pi - log(pi_ref/pi) - 1
  return np.exp(ref - logp) - (ref - logp) - 1.0


def test_importance_weighted_kl_is_eq_7_with_its_gradient():
  logp, old, ref, _, _, mask = _inputs()
  want = np.where(mask, np.exp(logp - old) * _k3(logp, ref), 0.0)
  f = lambda lp: importance_weighted_kl(  # noqa: E731
      jnp.where(mask, jnp.exp(ref - lp) - (ref - lp) - 1.0, 0.0), lp, jnp.asarray(old), mask)
  got = f(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
  # d/dlogp [r k3] = r k3 + r (1 - pi_ref/pi): the unbiased gradient (the ratio's is kept)
  grad = jax.grad(lambda lp: jnp.sum(f(lp)))(jnp.asarray(logp, jnp.float32))
  r = np.exp(logp - old)
  want_grad = np.where(mask, r * _k3(logp, ref) + r * (1.0 - np.exp(ref - logp)), 0.0)
  np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("delta", [1e-4, 0.05, 0.2])
def test_off_policy_sequence_mask_is_eq_9_row_by_row(delta):
  logp, _, _, sampler, adv, mask = _inputs(1)
  want = np.ones((B, N))
  for i in range(B):
    n = mask[i].sum()
    kl = sum(sampler[i, t] - logp[i, t] for t in range(N) if mask[i, t]) / n if n else 0.0
    for t in range(N):
      if adv[i, t] < 0 and kl > delta:
        want[i, t] = 0.0
  want = np.where(mask, want, 0.0)
  got = off_policy_sequence_mask(jnp.asarray(logp), jnp.asarray(sampler), jnp.asarray(adv), mask,
                                 delta)
  np.testing.assert_array_equal(np.asarray(got), want)
  assert 0 < (want[mask] == 0).sum() < mask.sum()  # some rows masked, not all
  # no gradient flows through the mask
  g = jax.grad(lambda lp: jnp.sum(off_policy_sequence_mask(lp, sampler, adv, mask, delta)))(
      jnp.asarray(logp, jnp.float32))
  assert not np.any(np.asarray(g))


def test_the_objective_with_both_switches_is_eq_8():
  """token-mean of min(r A, clip(r) A) M (negated) + beta * r * k3, against NumPy."""
  logp, old, ref, sampler, adv, mask = _inputs(2)
  beta, delta, eps = 0.05, 0.05, 0.2
  rl = rl_defaults(unbiased_kl=True, opsm_delta=delta, kl_coef=beta, kl_clamp=0.0)
  objective = make_objective(rl)
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  loss, sums = objective(f32(logp), f32(old), f32(adv), mask, f32(np.zeros((B, N))),
                         kl_coef=jnp.float32(beta), ref_logp=f32(ref), sampler_logp=f32(sampler))
  r = np.exp(logp - old)
  pg = -np.minimum(r * adv, np.clip(r, 1 - eps, 1 + eps) * adv)
  keep = np.asarray(off_policy_sequence_mask(f32(logp), f32(sampler), f32(adv), mask, delta))
  per_token = pg * keep + beta * r * np.minimum(_k3(logp, ref), 10.0)
  want = per_token[mask].sum() / mask.sum()
  np.testing.assert_allclose(float(loss), want, rtol=1e-6)
  assert float(sums["opsm_masked_frac"]) == (keep[mask] == 0).sum()
  # Off (the defaults): the same call without the switches is the plain objective.
  plain, _ = make_objective(rl_defaults(kl_coef=beta, kl_clamp=0.0))(
      f32(logp), f32(old), f32(adv), mask, f32(np.zeros((B, N))), kl_coef=jnp.float32(beta),
      ref_logp=f32(ref), sampler_logp=f32(sampler))
  want_plain = (pg + beta * np.minimum(_k3(logp, ref), 10.0))[mask].sum() / mask.sum()
  np.testing.assert_allclose(float(plain), want_plain, rtol=1e-6)


@pytest.mark.parametrize("field,value,needle", [
    ("unbiased_kl", True, "rl.unbiased_kl weights the KL term of the loss, but rl.kl_in='reward'"),
    ("opsm_delta", -0.1, r"rl.opsm_delta=-0.1; use 0 \(off\)"),
])
def test_bad_switches_are_one_sentence(field, value, needle):
  config = get_defaults()
  config.rl[field] = value
  config.rl.kl_in = "reward" if field == "unbiased_kl" else "loss"
  with pytest.raises(ConfigError, match=needle):
    validate(config)
