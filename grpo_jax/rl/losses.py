"""Per-token policy and value losses (to minimise). Reductions live in grpo_jax.rl.aggregation
and are re-exported here.

All per-token inputs are (B, T) with a (B, T) bool mask. Masked positions are replaced before
any arithmetic, so whatever they hold (even inf/nan) reaches neither the loss nor the gradient,
and every per-token output is exactly 0 (False for indicators) there.

POLICY_LOSSES (config field rl.loss) maps a name to loss(logp, old_logp, advantages, mask, *,
hyperparameters) -> (per-token loss (B, T), metrics): per-token bool `clipped`, float `ratio`,
and optionally bool `dual_clipped`. Its keyword-only parameters are its hyperparameters, rl
fields of the same names with these defaults, bound when the objective is built
(grpo_jax/registry.py `bind`); a new policy loss is one registered function (the two at the
end).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.errors import ConfigError
from grpo_jax.registry import Registry, hyperparameters
from grpo_jax.rl._checks import as_token_mask, require_shape
from grpo_jax.rl.aggregation import (LOSS_AGGREGATIONS, aggregate, loss_normalizer,  # noqa: F401
                                     masked_mean, masked_sum)


def _masked_inputs(mask, first, *others):
  """The bool mask (checked against first, a (B, T) array) and every input with 0 where
  ~mask (dtypes kept)."""
  mask = as_token_mask(mask, first)
  for i, x in enumerate(others):
    require_shape(f"per-token input #{i + 2}", x, mask.shape)
  return mask, tuple(jnp.where(mask, x, 0.0) for x in (first,) + others)


def ppo_clip_loss(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
                  mask: jax.Array, clip_low: float, clip_high: float,
                  dual_clip_c: float | None = None, log_ratio_clamp: float | None = 20.0):
  """PPO's clipped surrogate per token, with optional dual clip (Ye et al. 2020).

      rho  = exp(clip(logp - logp_old, -log_ratio_clamp, log_ratio_clamp))   (None: no clip)
      L    = max(-rho A, -clip(rho, 1 - clip_low, 1 + clip_high) A)
      L'   = min(L, -c A)  where A < 0  (dual_clip_c = c > 1), else L
           i.e. the objective max(min(rho A, clip(rho) A), c A) for negative advantages.

  Returns (loss (B, T), metrics) with per-token metrics: clipped (bool: the clipped term is the
  larger loss, so the gradient through rho is 0; reported whether or not the dual clip then
  acts), dual_clipped (bool: A < 0 and -c A < L, gradient 0) and ratio (float rho).
  """
  if dual_clip_c is not None and not dual_clip_c > 1.0:
    raise ValueError(f"dual_clip_c={dual_clip_c}; the dual clip needs c > 1 (e.g. 3.0).")
  mask, (logprobs, old_logprobs, advantages) = _masked_inputs(mask, logprobs, old_logprobs,
                                                              advantages)
  log_ratio = logprobs - old_logprobs
  if log_ratio_clamp is not None:
    log_ratio = jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp)
  ratio = jnp.exp(log_ratio)
  unclipped = -ratio * advantages
  clipped_loss = -jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
  loss = jnp.maximum(unclipped, clipped_loss)
  clipped = mask & (clipped_loss > unclipped)
  dual_clipped = jnp.zeros_like(mask)
  if dual_clip_c is not None:
    floor = -dual_clip_c * advantages
    dual_clipped = mask & (advantages < 0) & (floor < loss)
    loss = jnp.where(dual_clipped, floor, loss)
  metrics = dict(clipped=clipped, dual_clipped=dual_clipped, ratio=jnp.where(mask, ratio, 0.0))
  return jnp.where(mask, loss, 0.0), metrics


def clipped_surrogate(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
                      mask: jax.Array, clip_low: float, clip_high: float):
  """PPO's clipped objective as a per-token loss (to minimise), and where clipping was active.

      rho = exp(logp - logp_old)
      loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)     where mask, else 0

  All inputs (B, N), masked as the module docstring says. Returns (loss, clipped), clipped True
  where the clipped term is the smaller (the gradient through rho is 0 there): ppo_clip_loss
  without dual clip or log-ratio clamp.
  """
  loss, metrics = ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high,
                                dual_clip_c=None, log_ratio_clamp=None)
  return loss, metrics["clipped"]


def gspo_loss(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
              mask: jax.Array, clip_low: float, clip_high: float,
              log_ratio_clamp: float | None = 20.0):
  """GSPO-token (Zheng et al. 2025): a sequence-level ratio with per-token gradients.

      log s_i  = sum_t m_it (logp_it - logp_old_it) / max(sum_t m_it, 1)   (clipped to
                 +-log_ratio_clamp; None: no clip)
      s_{i,t}  = sg[s_i] * exp(logp_it - sg[logp_it])      (value s_i on every token)
      L_{i,t}  = -min(s_{i,t} A_it, clip(s_{i,t}, 1 - clip_low, 1 + clip_high) A_it)

  sg = stop_gradient, so dL_{i,t}/dlogp_{i,t} = -s_i A_it where unclipped, 0 where clipped,
  and nothing flows between tokens. With A constant over a sequence and seq-mean-token-mean
  aggregation this is the gradient of sequence-level GSPO. Returns (loss (B, T), metrics):
  clipped (bool per token) and ratio (s_i on each masked-in token).
  """
  mask, (logprobs, old_logprobs, advantages) = _masked_inputs(mask, logprobs, old_logprobs,
                                                              advantages)
  lengths = jnp.maximum(jnp.sum(mask, axis=1), 1).astype(jnp.float32)
  seq_log_ratio = jnp.sum(logprobs - old_logprobs, axis=1) / lengths
  if log_ratio_clamp is not None:
    seq_log_ratio = jnp.clip(seq_log_ratio, -log_ratio_clamp, log_ratio_clamp)
  seq_ratio = jnp.exp(jax.lax.stop_gradient(seq_log_ratio))
  ratio = seq_ratio[:, None] * jnp.exp(logprobs - jax.lax.stop_gradient(logprobs))
  unclipped = -ratio * advantages
  clipped_loss = -jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
  loss = jnp.where(mask, jnp.maximum(unclipped, clipped_loss), 0.0)
  metrics = dict(clipped=mask & (clipped_loss > unclipped), ratio=jnp.where(mask, ratio, 0.0))
  return loss, metrics


def truncated_is_weights(trainer_old_logprobs: jax.Array, rollout_logprobs: jax.Array,
                         mask: jax.Array, cap: float) -> jax.Array:
  """Truncated importance weights for sampler/trainer mismatch (TIS, Yao et al. 2025):

      w_t = sg[min(exp(logp_trainer_old_t - logp_rollout_t), cap)]     where mask, else 0

  Multiply the per-token policy-gradient loss by w. cap must be positive.
  """
  if not cap > 0:
    raise ValueError(f"cap={cap}; the importance-weight cap must be positive (e.g. 2.0).")
  mask, (trainer_old, rollout) = _masked_inputs(mask, trainer_old_logprobs, rollout_logprobs)
  weights = jnp.minimum(jnp.exp(trainer_old - rollout), cap)
  return jax.lax.stop_gradient(jnp.where(mask, weights, 0.0))


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array,
               clip_eps: float):
  """PPO's clipped value loss per token.

      V_c = clip(V, V_old - clip_eps, V_old + clip_eps)
      L   = 0.5 * max((V - R)^2, (V_c - R)^2)                 where mask, else 0

  Returns (loss (B, T), metrics) with clipped (bool: the clipped term is strictly larger,
  verl's vf_clipfrac indicator).
  """
  mask, (values, old_values, returns) = _masked_inputs(mask, values, old_values, returns)
  unclipped = jnp.square(values - returns)
  clipped_sq = jnp.square(jnp.clip(values, old_values - clip_eps, old_values + clip_eps) - returns)
  loss = jnp.where(mask, 0.5 * jnp.maximum(unclipped, clipped_sq), 0.0)
  return loss, dict(clipped=mask & (clipped_sq > unclipped))


def entropy_bonus(entropy: jax.Array, mask: jax.Array, coef: float) -> jax.Array:
  """The entropy bonus as a per-token loss term: -coef * H_t where mask, else 0."""
  mask, (entropy,) = _masked_inputs(mask, entropy)
  return jnp.where(mask, -coef * entropy, 0.0)


POLICY_LOSSES = Registry("rl.loss")


def check_log_ratio_clamp(log_ratio_clamp) -> str | None:
  """The sentence refusing a negative rl.log_ratio_clamp (the clip's bounds would cross), or
  None."""
  if not log_ratio_clamp >= 0:
    return (f"rl.log_ratio_clamp={log_ratio_clamp}; use 0 (off) or a bound > 0 on |log pi - "
            f"log pi_old| before exp (20 is usual).")
  return None


def check_unread_settings(rl) -> None:
  """Raises ConfigError when rl sets another policy loss's hyperparameter away from its default
  although rl.loss does not take it (rl.dual_clip_c under gspo would be silently ignored)."""
  own = hyperparameters(POLICY_LOSSES.get(rl.loss))
  for other, fn in POLICY_LOSSES.items():
    for field, default in hyperparameters(fn).items():
      if field not in own and rl.get(field, default) != default:
        raise ConfigError(f"rl.{field}={rl[field]} is a hyperparameter of rl.loss={other!r}, "
                          f"which rl.loss={rl.loss!r} does not take; set it back to {default} "
                          f"or use rl.loss={other!r}.")


def check_clip(clip_eps_low, clip_eps_high, dual_clip_c=0.0, log_ratio_clamp=20.0, **_):
  if not (clip_eps_low > 0 and clip_eps_high > 0):
    return (f"rl.clip_eps_low={clip_eps_low}, rl.clip_eps_high={clip_eps_high}; use positive "
            f"values such as 0.2 and 0.28.")
  if not (dual_clip_c == 0 or dual_clip_c > 1):
    return f"rl.dual_clip_c={dual_clip_c}; use 0 (off) or a constant > 1 such as 3.0."
  return check_log_ratio_clamp(log_ratio_clamp)


@POLICY_LOSSES.register("ppo_clip", check=check_clip)
def ppo_clip(logprobs, old_logprobs, advantages, mask, *, clip_eps_low=0.2, clip_eps_high=0.2,
             dual_clip_c=0.0, log_ratio_clamp=20.0):
  """ppo_clip_loss. clip_eps_high=0.28: DAPO's clip-higher; dual_clip_c > 1 for A < 0 (verl
  3.0), 0 = off; the log-ratio clamped to +-log_ratio_clamp before exp, 0 = off."""
  return ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_eps_low, clip_eps_high,
                       dual_clip_c or None, log_ratio_clamp or None)


@POLICY_LOSSES.register("gspo", check=check_clip)
def gspo(logprobs, old_logprobs, advantages, mask, *, clip_eps_low=0.2, clip_eps_high=0.2,
         log_ratio_clamp=20.0):
  """gspo_loss (log_ratio_clamp 0 = off)."""
  return gspo_loss(logprobs, old_logprobs, advantages, mask, clip_eps_low, clip_eps_high,
                   log_ratio_clamp or None)
