"""GFPO, Group Filtered Policy Optimization (Shrivastava et al. 2025, arXiv 2508.09726, "Sample
More to Think Less"): sample G' completions per prompt, keep the k with the best metric, and
learn from those k alone.

    S_g  = the k rows of group g with the best metric     (ties: the lower row index wins)
    m_i  = 1 if i in S_g else 0
    A_i  = m_i (R_i - mean_{S_g} R) / (std_{S_g} R + eps)

metric "length": the k shortest completions; "token_efficiency": the k largest R_i / |o_i|
(reward per token). Rows are grouped contiguously as in grpo_jax.rl.advantages: rows
[g*G', (g+1)*G') are the G' completions of prompt g. Training on the kept rows alone (gathered
with gfpo_kept_rows) with the usual group estimator over groups of k gives the same A on them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl._checks import require_groups, require_shape, safe_sqrt, tied_groups

GFPO_METRICS = ("length", "token_efficiency")


def _check_groups(name: str, values: jax.Array, group_size: int, keep: int | None = None) -> None:
  """Raises unless values is (num_prompts * group_size,) and, if given, 1 <= keep <= group_size."""
  require_groups(values, group_size, name=name)
  if keep is not None and not 1 <= keep <= group_size:
    raise ValueError(f"keep={keep} must be between 1 and group_size={group_size}; GFPO keeps k "
                     f"of the G' completions of each prompt.")


def gfpo_keep_mask(rewards: jax.Array, lengths: jax.Array, group_size: int, keep: int,
                   metric: str) -> jax.Array:
  """Which rows GFPO keeps: exactly `keep` True in each group of `group_size` rows, (B,) bool.

      "length":            the keep smallest |o_i|
      "token_efficiency":  the keep largest  R_i / max(|o_i|, 1)

  Ties go to the lower row index (a stable sort over (score, row)); a NaN efficiency ranks
  last. rewards: (B,) float, lengths: (B,) int (completion tokens).
  """
  if metric not in GFPO_METRICS:
    raise ValueError(f"Unknown GFPO metric {metric!r}; valid: {', '.join(GFPO_METRICS)}.")
  _check_groups("rewards", rewards, group_size, keep)
  require_shape("lengths", lengths, jnp.shape(rewards))
  lengths = jnp.asarray(lengths).astype(jnp.int32)
  if metric == "length":
    cost = lengths  # smaller is better
  else:  # larger efficiency is better
    cost = -(jnp.asarray(rewards).astype(jnp.float32) / jnp.maximum(lengths, 1))
  order = jnp.argsort(cost.reshape(-1, group_size), axis=1, stable=True)  # best first
  chosen = order[:, :keep, None] == jnp.arange(group_size)  # (groups, keep, group_size)
  return jnp.any(chosen, axis=1).reshape(-1)


def gfpo_kept_rows(keep_mask: jax.Array, group_size: int, keep: int) -> jax.Array:
  """The kept rows' indices, (B / group_size * keep,) int32: group by group, and within a
  group in row order, so rows [g*keep, (g+1)*keep) of the result are prompt g's.

  keep_mask must hold exactly `keep` True per group (as gfpo_keep_mask gives). Otherwise each
  group yields its True rows then its False rows, both in row order, cut to `keep`.
  """
  _check_groups("keep_mask", keep_mask, group_size, keep)
  rejected = ~jnp.asarray(keep_mask).astype(bool).reshape(-1, group_size)
  local = jnp.argsort(rejected, axis=1, stable=True)[:, :keep]  # kept first, in row order
  offsets = jnp.arange(rejected.shape[0])[:, None] * group_size
  return (local + offsets).reshape(-1).astype(jnp.int32)


def gfpo_advantages(rewards: jax.Array, keep_mask: jax.Array, group_size: int,
                    eps: float = 1e-6, scale: bool = True) -> jax.Array:
  """GFPO's advantages, (B,) float32: group-normalised over the kept set S_g, 0 elsewhere.

      n     = |S_g|;  mu = sum_{S_g} R / n;  var = sum_{S_g} (R - mu)^2 / max(n - 1, 1)
      A_i   = (R_i - mu) / (sqrt(var) + eps)      i in S_g   (scale=False: R_i - mu)
      A_i   = 0                                   i not in S_g

  The standard deviation is the unbiased (n-1) one, as in group_normalized_advantages (and TRL's
  GFPO, torch.std over the kept k), so on the kept rows this equals
  group_normalized_advantages(rewards[kept], keep). A group keeping one row gets A = 0.
  Rejected rows' rewards (even inf/nan) reach neither output nor gradient.
  """
  _check_groups("rewards", rewards, group_size)
  require_shape("keep_mask", keep_mask, jnp.shape(rewards))
  mask = jnp.asarray(keep_mask).astype(bool).reshape(-1, group_size)
  rewards = jnp.where(mask, jnp.asarray(rewards).astype(jnp.float32).reshape(-1, group_size), 0.0)
  count = jnp.sum(mask, axis=1, keepdims=True).astype(jnp.float32)
  mean = jnp.sum(rewards, axis=1, keepdims=True) / jnp.maximum(count, 1.0)
  centred = jnp.where(mask & ~tied_groups(rewards, mask), rewards - mean, 0.0)
  if scale:
    var = jnp.sum(centred * centred, axis=1, keepdims=True) / jnp.maximum(count - 1.0, 1.0)
    centred = centred / (safe_sqrt(var) + eps)
  return jnp.where(mask, centred, 0.0).reshape(-1)
