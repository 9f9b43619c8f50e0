"""Advantage estimators: rewards in, per-completion or per-token advantages out.

Rows are grouped contiguously: rows [g*G, (g+1)*G) are the G completions of prompt g. Per-token
outputs are (B, T) and exactly 0 where the (B, T) bool mask is False. Token-level estimators
that need a recursion over time (GAE, discounted returns, process supervision) live in
grpo_jax.rl.token_advantages.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl._checks import require_groups, require_shape, safe_sqrt, tied_groups


def group_normalized_advantages(rewards: jax.Array, group_size: int, eps: float = 1e-6,
                                scale_by_std: bool = True) -> jax.Array:
  """GRPO outcome advantages (DeepSeekMath §4.1.2), one per completion.

      A_i = (r_i - mean_group(r)) / (std_group(r) + eps)

  with the unbiased (n-1) standard deviation of the group; scale_by_std=False gives
  r_i - mean_group(r) (Dr. GRPO). A tied group gets exactly 0 (_checks.tied_groups). rewards:
  (B,) with B = num_prompts * group_size.
  """
  require_groups(rewards, group_size)
  groups = rewards.astype(jnp.float32).reshape(-1, group_size)
  centred = _centred(groups, groups.mean(axis=1, keepdims=True))
  if scale_by_std:
    if group_size < 2:
      raise ValueError("group_size=1 has no group standard deviation; use group_size >= 2.")
    centred = centred / (groups.std(axis=1, ddof=1, keepdims=True) + eps)
  return centred.reshape(-1)


def broadcast_to_tokens(sequence_values: jax.Array, mask: jax.Array) -> jax.Array:
  """(B,) -> (B, N): each completion's value on each of its tokens, 0 on masked positions."""
  return jnp.where(mask.astype(bool), sequence_values[:, None], 0.0)


def _rows_to_tokens(values: jax.Array, mask: jax.Array) -> jax.Array:
  """broadcast_to_tokens after checking that values is (B,) for a (B, T) mask."""
  if jnp.ndim(mask) != 2:
    raise ValueError(f"mask must be (B, T); got shape {tuple(jnp.shape(mask))}.")
  require_shape("per-row values", values, jnp.shape(mask)[:1])
  return broadcast_to_tokens(values, mask)


def _centred(groups: jax.Array, baseline: jax.Array) -> jax.Array:
  """groups (n, G) - baseline, exactly 0 in a tied group (_checks.tied_groups)."""
  return jnp.where(tied_groups(groups), 0.0, groups - baseline)


def _group_centred(rewards: jax.Array, group_size: int) -> jax.Array:
  """(B,) -> (B,): each reward minus its group's mean, exactly 0 in a tied group."""
  groups = rewards.astype(jnp.float32).reshape(-1, group_size)
  return _centred(groups, groups.mean(axis=1, keepdims=True)).reshape(-1)


def grpo_batch_std_advantages(rewards: jax.Array, group_size: int, mask: jax.Array,
                              eps: float = 1e-6) -> jax.Array:
  """Group-centred, batch-scaled advantages (TRL scale_rewards="batch"), per token.

      A_{i,t} = (r_i - mean_group(r)) / (std_batch(r) + eps)     where mask, else 0

  std_batch is the unbiased (n-1) standard deviation of all B rewards. rewards: (B,).
  """
  require_groups(rewards, group_size)
  if rewards.shape[0] < 2:
    raise ValueError("a batch of one reward has no standard deviation; use B >= 2.")
  rewards = rewards.astype(jnp.float32)
  centred = _group_centred(rewards, group_size)
  return _rows_to_tokens(centred / (jnp.std(rewards, ddof=1) + eps), mask)


def rloo_advantages(rewards: jax.Array, group_size: int, mask: jax.Array) -> jax.Array:
  """REINFORCE leave-one-out advantages (Ahmadian et al. 2024), per token.

      A_{i,t} = r_i - (1 / (G-1)) * sum_{j in group(i), j != i} r_j     where mask, else 0
  """
  require_groups(rewards, group_size, min_size=2)
  groups = rewards.astype(jnp.float32).reshape(-1, group_size)
  others = (groups.sum(axis=1, keepdims=True) - groups) / (group_size - 1)
  return _rows_to_tokens(_centred(groups, others).reshape(-1), mask)


def remax_advantages(rewards: jax.Array, greedy_rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """ReMax advantages (Li et al. 2023): the greedy completion's reward as baseline, per token.

      A_{i,t} = r_i - r_greedy(prompt of i)     where mask, else 0

  greedy_rewards is already given per row: (B,), like rewards.
  """
  require_shape("greedy_rewards", greedy_rewards, jnp.shape(rewards))
  baseline_free = rewards.astype(jnp.float32) - greedy_rewards.astype(jnp.float32)
  return _rows_to_tokens(baseline_free, mask)


def masked_whiten(values: jax.Array, mask: jax.Array, shift_mean: bool = True,
                  eps: float = 1e-8) -> jax.Array:
  """Whitening over the masked-in entries of the whole array.

      n = sum m;  mu = sum m v / max(n, 1);  var = sum m (v - mu)^2 / max(n - 1, 1)
      out = (v - mu) / (sqrt(var) + eps)  [+ mu if not shift_mean]      where m, else 0

  The variance is the unbiased one (verl's masked_whiten with the n/(n-1) correction). Unlike
  verl's rsqrt(var + eps), eps is added to the standard deviation, as in (x - mean)/(std + eps)
  elsewhere here; the two differ by O(eps). With n <= 1 the variance is 0 (no error is raised
  inside jit). Masked entries (even inf/nan) reach neither output nor gradient.
  """
  require_shape("mask", mask, jnp.shape(values))
  mask = jnp.asarray(mask).astype(bool)
  values = jnp.where(mask, values.astype(jnp.float32), 0.0)
  count = jnp.sum(mask.astype(jnp.float32))
  mean = jnp.sum(values) / jnp.maximum(count, 1.0)
  centred = jnp.where(mask, values - mean, 0.0)
  var = jnp.sum(centred * centred) / jnp.maximum(count - 1.0, 1.0)
  whitened = centred / (safe_sqrt(var) + eps)
  if not shift_mean:
    whitened = whitened + mean
  return jnp.where(mask, whitened, 0.0)


def reinforce_pp_baseline_advantages(rewards: jax.Array, group_size: int, mask: jax.Array,
                                     eps: float = 1e-8) -> jax.Array:
  """REINFORCE++-baseline (verl's reinforce_plus_plus_baseline), per token.

      c_{i,t} = r_i - mean_group(r)                           on masked-in tokens
      A = masked_whiten(c, mask, shift_mean=True, eps)        over all masked-in batch tokens

  so every token counts once in the batch mean / unbiased variance (longer completions weigh
  more). rewards: (B,), mask: (B, T).
  """
  require_groups(rewards, group_size)
  rewards = rewards.astype(jnp.float32)
  centred = _rows_to_tokens(_group_centred(rewards, group_size), mask)
  return masked_whiten(centred, mask, shift_mean=True, eps=eps)


def place_reward_on_last_token(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """(B,) outcome rewards -> (B, T) token rewards: r_i on row i's last masked-in token.

      R_{i,t} = r_i  if t == max{s : m_{i,s}}  else 0

  A row with no masked-in token gets no reward anywhere.
  """
  if jnp.ndim(mask) != 2:
    raise ValueError(f"mask must be (B, T); got shape {tuple(jnp.shape(mask))}.")
  require_shape("rewards", rewards, jnp.shape(mask)[:1])
  mask = jnp.asarray(mask).astype(bool)
  length = mask.shape[1]
  last = length - 1 - jnp.argmax(mask[:, ::-1], axis=1)
  is_last = mask & (jnp.arange(length)[None, :] == last[:, None])
  return jnp.where(is_last, rewards.astype(jnp.float32)[:, None], 0.0)
