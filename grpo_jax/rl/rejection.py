"""Rejection sampling of off-policy tokens: verl's rollout correction `rollout_rs` modes
(verl/trainer/ppo/rollout_corr_helper.py `compute_rollout_rejection_mask`; docs/algo/
rollout_corr.md), registered in rl.is_correction as "rs_<option>" and composable with one
importance weight by "+" (corrections.make_correction): e.g. "tis_sequence+rs_seq_mean_k1".

With d_t = clip(log pi_prox_t - log mu_t, -20, 20) on the loss's tokens (m_t), a divergence per
token (the KL estimators of KL(mu || pi_prox) on mu's samples):

    k1_t = -d_t = log(mu_t / pi_prox_t)      k2_t = d_t^2 / 2      k3_t = exp(d_t) - 1 - d_t

is reduced to a statistic S at a level:

    token     S_t = k_t                                (each token judged alone)
    seq_sum   S_i = sum_t m_t k_t                      (the whole row judged)
    seq_mean  S_i = sum_t m_t k_t / sum_t m_t          (seq_mean_k1: the geometric mean ratio)
    seq_max   S_i = max_{t: m_t} k_t  (0 without tokens; k2 and k3 only)

and a token (a row's every token, at a sequence level) is kept when

    k1:       log(rs_low) <= S <= log(rs_high)    i.e. rs_low <= mu / pi_prox <= rs_high
              (geometric mean over the row for seq_mean); rs_low = 0 means 1 / rs_high
    k2, k3:   S <= rs_kl_max

The weight is w_t = 1 where kept, else 0 (no gradient). Note the direction of k1: verl's bounds
apply to mu / pi_prox (its statistic is -log r), so [rs_low, rs_high] on mu / pi_prox is
[1 / rs_high, 1 / rs_low] on pi_prox / mu; the default rs_low = 1 / rs_high is symmetric.

"rs_veto" is the per-token veto of verl 0.6 (rollout_is_veto_threshold; 0.9.1 dropped it for
seq_max_k2 / k3): a row with any token whose pi_prox / mu < rl.rs_veto_threshold gets weight 0.

One difference from verl: verl removes rejected tokens from the response mask (the loss's
token-mean denominator, the KL and entropy terms); here their policy-gradient weight is 0 and
they keep their place in the denominator, as IcePop's masked tokens do in both.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from grpo_jax.rl._checks import as_token_mask, require_shape
from grpo_jax.rl.correction_registry import IS_CORRECTIONS, SAFETY_BOUND

# divergence name -> k(d) per token, d = clipped log(pi_prox / mu)
DIVERGENCES = {
    "k1": lambda d: -d,
    "k2": lambda d: 0.5 * d * d,
    "k3": lambda d: jnp.exp(d) - 1.0 - d,
}


def _token(k, mask):
  return k


def _seq_sum(k, mask):
  return jnp.sum(jnp.where(mask, k, 0.0), axis=-1, keepdims=True)


def _seq_mean(k, mask):
  count = jnp.sum(mask, axis=-1, keepdims=True).astype(k.dtype)
  return _seq_sum(k, mask) / jnp.maximum(count, 1.0)


def _seq_max(k, mask):
  top = jnp.max(jnp.where(mask, k, -jnp.inf), axis=-1, keepdims=True)
  return jnp.where(jnp.isneginf(top), 0.0, top)


# level name -> S(k, mask): (B, N) per token, or (B, 1) per row (broadcast to its tokens)
LEVELS = {"token": _token, "seq_sum": _seq_sum, "seq_mean": _seq_mean, "seq_max": _seq_max}


def divergence_statistic(behaviour_logp, proximal_logp, mask, level: str, divergence: str):
  """S of the module docstring, broadcast to (B, N): LEVELS[level] of DIVERGENCES[divergence]
  of d_t = clip(log pi_prox_t - log mu_t, -20, 20), 0 where ~mask before reducing."""
  mask = as_token_mask(mask, proximal_logp)
  require_shape("behaviour_logp", behaviour_logp, mask.shape)
  d = jnp.clip(jnp.where(mask, proximal_logp - behaviour_logp, 0.0), -SAFETY_BOUND,
               SAFETY_BOUND)
  stat = LEVELS[level](DIVERGENCES[divergence](d), mask)
  return jnp.broadcast_to(stat, mask.shape)


def ratio_bounds(rs_low: float, rs_high: float) -> tuple[float, float]:
  """(log lower, log upper) of the k1 modes' bounds on mu / pi_prox; rs_low 0 = 1 / rs_high."""
  low = rs_low if rs_low > 0 else 1.0 / rs_high
  return math.log(low), math.log(rs_high)


def rejection_weights(behaviour_logp, proximal_logp, mask, level: str, divergence: str, *,
                      rs_low: float = 0.0, rs_high: float = 2.0, rs_kl_max: float = 0.01):
  """w_t = sg[1 if mask_t and S passes its bound (module docstring) else 0], (B, N) float32."""
  mask = as_token_mask(mask, proximal_logp)
  stat = divergence_statistic(behaviour_logp, proximal_logp, mask, level, divergence)
  if divergence == "k1":
    log_low, log_high = ratio_bounds(rs_low, rs_high)
    keep = (stat >= log_low) & (stat <= log_high)
  else:
    keep = stat <= rs_kl_max
  return jax.lax.stop_gradient((mask & keep).astype(jnp.float32))


def _check_ratio_bounds(rs_low=0.0, rs_high=2.0, **_):
  if not (rs_high > 0 and rs_low >= 0 and (rs_low or 1.0 / rs_high) <= rs_high):
    return (f"rl.rs_low={rs_low}, rl.rs_high={rs_high}; the k1 rejection modes keep "
            f"rs_low <= mu/pi_prox <= rs_high and need rs_high > 0 and 0 <= rs_low <= rs_high "
            f"(rs_low 0 = 1/rs_high, so rs_high >= 1 then; verl's presets: 2.0, and 1.001 "
            f"for seq_mean_k1).")
  return None


def _check_kl_max(rs_kl_max=0.01, **_):
  if not rs_kl_max > 0:
    return (f"rl.rs_kl_max={rs_kl_max}; the k2/k3 rejection modes need a positive bound on "
            f"the divergence (verl's k3 presets: 0.01).")
  return None


def _register(level: str, divergence: str) -> None:
  """Registers "rs_<level>_<divergence>" with the hyperparameters its divergence reads."""
  name = f"rs_{level}_{divergence}"
  if divergence == "k1":
    def fn(behaviour_logp, proximal_logp, mask, *, rs_low=0.0, rs_high=2.0):
      return rejection_weights(behaviour_logp, proximal_logp, mask, level, divergence,
                               rs_low=rs_low, rs_high=rs_high)
    check = _check_ratio_bounds
    bound = "log(rs_low) <= S <= log(rs_high)"
  else:
    def fn(behaviour_logp, proximal_logp, mask, *, rs_kl_max=0.01):
      return rejection_weights(behaviour_logp, proximal_logp, mask, level, divergence,
                               rs_kl_max=rs_kl_max)
    check = _check_kl_max
    bound = "S <= rs_kl_max"
  fn.__name__ = fn.__qualname__ = name
  fn.__doc__ = (f"verl rollout_rs={level}_{divergence!r}: w_t = 1 where S = {level} of "
                f"{divergence} passes {bound}, else 0 (rl/rejection.py's docstring).")
  IS_CORRECTIONS.register(name, fn, check=check)


# verl 0.9.1's SUPPORTED_ROLLOUT_RS_OPTIONS: seq_max has no k1 (a max of signed log ratios)
REJECTION_OPTIONS = tuple(f"{level}_{k}" for level in LEVELS for k in DIVERGENCES
                          if not (level == "seq_max" and k == "k1"))
for _option in REJECTION_OPTIONS:
  _register(*_option.rsplit("_", 1))


def _check_veto(rs_veto_threshold=1e-4, **_):
  if not 0 < rs_veto_threshold <= 1:
    return (f"rl.rs_veto_threshold={rs_veto_threshold}; rs_veto drops rows with a token whose "
            f"pi_prox/mu is below it, a value in (0, 1] (verl 0.6's default 1e-4).")
  return None


@IS_CORRECTIONS.register("rs_veto", check=_check_veto)
def rs_veto(behaviour_logp, proximal_logp, mask, *, rs_veto_threshold=1e-4):
  """verl 0.6's rollout_is_veto_threshold (verl/trainer/ppo/mismatch_helper.py): w_t = 0 on
  every token of a row holding a token with log pi_prox - log mu < log(rs_veto_threshold) (the
  ratio unclipped), else 1; (B, N), no gradient."""
  mask = as_token_mask(mask, proximal_logp)
  require_shape("behaviour_logp", behaviour_logp, mask.shape)
  vetoed = mask & (proximal_logp - behaviour_logp < jnp.log(jnp.float32(rs_veto_threshold)))
  keep = mask & ~jnp.any(vetoed, axis=-1, keepdims=True)
  return jax.lax.stop_gradient(keep.astype(jnp.float32))
