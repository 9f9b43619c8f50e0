"""Policy-gradient losses and masked aggregation."""

from __future__ import annotations

import jax
import jax.numpy as jnp

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


def masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
  return jnp.sum(jnp.where(mask.astype(bool), values, 0.0))


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(values * mask) / max(sum(mask), 1); masked entries contribute nothing (NaNs included)."""
  return masked_sum(values, mask) / jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
  """Reduces a (B, N) per-token loss to a scalar.

  token-mean:           sum_{i,t} m_it l_it / sum_{i,t} m_it
  seq-mean-token-mean:  (1/B) sum_i [ sum_t m_it l_it / sum_t m_it ]   (DeepSeekMath's 1/|o_i|)
  """
  mask = mask.astype(bool)
  if mode == "token-mean":
    return masked_mean(per_token, mask)
  if mode == "seq-mean-token-mean":
    per_seq = jnp.sum(jnp.where(mask, per_token, 0.0), axis=1) / jnp.maximum(
        jnp.sum(mask, axis=1), 1)
    return jnp.mean(per_seq)
  raise ValueError(f"Unknown loss aggregation {mode!r}; valid: {', '.join(LOSS_AGGREGATIONS)}.")


def clipped_surrogate(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array,
                      mask: jax.Array, clip_low: float, clip_high: float):
  """PPO's clipped objective as a per-token loss (to minimise), and where clipping was active.

      rho = exp(logp - logp_old)
      loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)     where mask, else 0

  All inputs (B, N). Masked positions are replaced before any arithmetic, so whatever they
  hold (even inf/nan) reaches neither the loss nor the gradient. Returns (loss, clipped), where
  clipped is True where the clipped term is the smaller (the gradient through rho is 0 there).
  """
  mask = mask.astype(bool)
  logprobs = jnp.where(mask, logprobs, 0.0)
  old_logprobs = jnp.where(mask, old_logprobs, 0.0)
  advantages = jnp.where(mask, advantages, 0.0)
  ratio = jnp.exp(logprobs - old_logprobs)
  unclipped = ratio * advantages
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
  return -jnp.minimum(unclipped, clipped), mask & (clipped < unclipped)
