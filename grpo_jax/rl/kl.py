"""Per-token KL estimators between the policy and a reference (Schulman's k1/k2/k3), and the
adaptive KL coefficient of Ziegler et al. (2019).

With d = logp - ref_logp (log-probs of the same sampled tokens under pi and pi_ref):
    k1 = d               unbiased, can be negative
    k2 = d^2 / 2         biased, >= 0
    k3 = e^{-d} + d - 1  unbiased, >= 0, low variance (DeepSeekMath eq. 4)
Where `mask` is False every estimate is exactly 0 and no gradient flows (masked inputs are
replaced before use, so inf/nan there change nothing).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.registry import Registry
from grpo_jax.rl._checks import require_shape

# name -> estimate(d, value_clamp) of the (already clamped) log-ratio d, per token; config
# field rl.kl_estimator. value_clamp bounds the estimate where the estimator uses one (k3).
KL_ESTIMATORS = Registry("rl.kl_estimator")


def _log_ratio(logprobs, ref_logprobs, mask):
  """d = logp - ref_logp, with both replaced by 0 where ~mask (so d = 0 there)."""
  require_shape("ref_logprobs", ref_logprobs, jnp.shape(logprobs))
  if mask is not None:
    require_shape("mask", mask, jnp.shape(logprobs))
    mask = jnp.asarray(mask).astype(bool)
    logprobs = jnp.where(mask, logprobs, 0.0)
    ref_logprobs = jnp.where(mask, ref_logprobs, 0.0)
  return logprobs - ref_logprobs


def kl_k1(logprobs: jax.Array, ref_logprobs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """k1 = d = logp - ref_logp per token (0 where ~mask)."""
  return _log_ratio(logprobs, ref_logprobs, mask)


def kl_k2(logprobs: jax.Array, ref_logprobs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """k2 = d^2 / 2 with d = logp - ref_logp, per token (0 where ~mask)."""
  return _k2(_log_ratio(logprobs, ref_logprobs, mask), None)


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Low-variance unbiased KL(pi || pi_ref) estimate per sampled token (DeepSeekMath eq. 4).

      k3 = exp(ref - logp) - (ref - logp) - 1 = e^{-d} + d - 1  >= 0

  Inputs are log-probs of the same sampled tokens, any matching shape. Where `mask` is False
  the result is exactly 0 and no gradient flows (masked inputs are replaced before use).
  """
  return _k3(_log_ratio(logprobs, ref_logprobs, mask), None)


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, mask: jax.Array | None = None,
               kind: str = "k3", clamp: float | None = 20.0,
               k3_clamp: float | None = 10.0) -> jax.Array:
  """One of k1 / k2 / k3 per token, optionally clamped as verl does for k3 ("low_var_kl").

      d' = clip(d, -clamp, clamp)                  (no clip when clamp is None)
      k1 = d',  k2 = d'^2 / 2,  k3 = clip(e^{-d'} + d' - 1, -k3_clamp, k3_clamp)

  The d clamp (default 20) keeps e^{-d} finite; the k3 value clamp (default 10, None = off)
  bounds single-token outliers (k3 >= 0, so only the upper bound ever acts). Both clamps zero
  the gradient where they are active. 0 where ~mask. An unregistered kind raises a ConfigError
  naming the registered ones (KL_ESTIMATORS).
  """
  estimate = KL_ESTIMATORS.get(kind)
  d = _log_ratio(logprobs, ref_logprobs, mask)
  if clamp is not None:
    d = jnp.clip(d, -clamp, clamp)
  return estimate(d, k3_clamp)


@KL_ESTIMATORS.register("k1")
def _k1(d, value_clamp):
  del value_clamp
  return d


@KL_ESTIMATORS.register("k2")
def _k2(d, value_clamp):
  del value_clamp
  return 0.5 * d * d


@KL_ESTIMATORS.register("k3")
def _k3(d, value_clamp):
  k3 = jnp.exp(-d) + d - 1.0
  return k3 if value_clamp is None else jnp.clip(k3, -value_clamp, value_clamp)


def adaptive_kl_coef(beta, observed_kl, target: float, horizon: float, n_steps):
  """Adaptive KL controller (Ziegler et al. 2019), the next coefficient:

      beta' = beta * (1 + clip(observed_kl / target - 1, -0.2, 0.2) * n_steps / horizon)

  observed_kl is the measured KL, n_steps the number of samples (or steps) since the last
  update. target and horizon must be positive.
  """
  if target <= 0 or horizon <= 0:
    raise ValueError(f"target={target} and horizon={horizon} must both be positive.")
  error = jnp.clip(jnp.asarray(observed_kl, jnp.float32) / target - 1.0, -0.2, 0.2)
  return beta * (1.0 + error * n_steps / horizon)
