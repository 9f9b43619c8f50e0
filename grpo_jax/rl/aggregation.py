"""Masked reductions and the loss aggregation modes, exact under micro-batching.

A (B, T) per-token loss l with mask m reduces to a scalar as numerator / normaliser:

  mode                      numerator (per micro-batch)          normaliser (of the batch)
  token-mean                sum_{i,t} m l                        max(sum_{i,t} m, 1)
  seq-mean-token-mean       sum_i sum_t m l / max(sum_t m, 1)    B
  seq-mean-token-sum        sum_{i,t} m l                        B
  seq-mean-token-sum-norm   sum_{i,t} m l                        B * T   (Dr. GRPO)

B counts every row, rows with no masked-in token included: such a row adds 0 to the numerator
and 1 to B. That is verl's convention on its current worker path, which passes
global_batch_size = ppo_mini_batch_size * n to agg_loss; verl's agg_loss called without it (the
legacy dp_actor) excludes fully masked rows (B = rows with at least one token). The two agree
unless a row is fully masked, which here happens only with rl.mask_truncated. T is the padded length, so every micro-batch must share it. For
seq-mean-token-sum-norm verl divides by T alone; here it is B * T, a mean over sequences of
(token sum / T), the same loss up to the constant 1/B.

Gradient accumulation: split the rows of a batch into micro-batches (a row never split), pass
normalizer=loss_normalizer(full_mask, mode) to aggregate on each, and the sum of the results,
and of their gradients, equals aggregate on the full batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl._checks import as_token_mask

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                     "seq-mean-token-sum-norm")


def masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(values where mask); masked entries contribute nothing (NaNs included)."""
  return jnp.sum(jnp.where(mask.astype(bool), values, 0.0))


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(values * mask) / max(sum(mask), 1); masked entries contribute nothing (NaNs included)."""
  return masked_sum(values, mask) / jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)


def _check_mode(mode: str) -> None:
  if mode not in LOSS_AGGREGATIONS:
    raise ValueError(f"Unknown loss aggregation {mode!r}; valid: {', '.join(LOSS_AGGREGATIONS)}.")


def loss_normalizer(mask: jax.Array, mode: str) -> jax.Array:
  """The denominator of `mode` for a (B, T) mask (table in the module docstring), a float32
  scalar: max(#masked-in tokens, 1), B, B, or B * T."""
  _check_mode(mode)
  if jnp.ndim(mask) != 2:
    raise ValueError(f"mask must be (B, T); got shape {tuple(jnp.shape(mask))}.")
  rows, length = jnp.shape(mask)
  if mode == "token-mean":
    return jnp.maximum(jnp.sum(jnp.asarray(mask).astype(jnp.float32)), 1.0)
  if mode == "seq-mean-token-sum-norm":
    return jnp.asarray(rows * length, jnp.float32)
  return jnp.asarray(rows, jnp.float32)


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str,
              normalizer: jax.Array | float | None = None) -> jax.Array:
  """Reduces a (B, T) per-token loss to a scalar: numerator / normaliser (module docstring).

  token-mean:               sum_{i,t} m_it l_it / sum_{i,t} m_it
  seq-mean-token-mean:      (1/B) sum_i [ sum_t m_it l_it / sum_t m_it ]   (DeepSeekMath's 1/|o_i|)
  seq-mean-token-sum:       (1/B) sum_{i,t} m_it l_it
  seq-mean-token-sum-norm:  (1/(B T)) sum_{i,t} m_it l_it

  normalizer=None uses loss_normalizer(mask, mode) of these rows; pass the full batch's to
  make micro-batch results sum to the full-batch aggregate. Masked entries (even inf/nan)
  reach neither the result nor the gradient.
  """
  _check_mode(mode)
  mask = as_token_mask(mask, per_token)
  if normalizer is None:
    normalizer = loss_normalizer(mask, mode)
  masked = jnp.where(mask, per_token, 0.0)
  if mode == "seq-mean-token-mean":
    lengths = jnp.maximum(jnp.sum(mask, axis=1), 1)
    return jnp.sum(jnp.sum(masked, axis=1) / lengths) / normalizer
  return jnp.sum(masked) / normalizer
