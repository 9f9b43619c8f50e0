"""Token-level advantage estimators that run a recursion over the completion's tokens:
discounted returns (REINFORCE++), GAE (PPO), and process supervision (DeepSeekMath §4.1.3).

Shapes: B rows (groups contiguous, rows [g*G, (g+1)*G) share a prompt), T completion tokens,
mask (B, T) bool. Outputs are exactly 0 where the mask is False, and masked inputs (even
inf/nan) are replaced before any arithmetic.

Masks and time. The recursions run over each row's masked-in tokens in order: a masked-out
position is skipped (treated as absent), so the "next" token of t is the next masked-in one,
and the value after a row's last masked-in token is 0. Completion masks here are prefixes
(right padding), for which this is exactly per-sequence discounting with exponent k - t; for a
mask with holes (e.g. tool output removed from a multi-turn completion) the exponent counts
masked-in tokens only, and a hole is never treated as the end of an episode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl._checks import as_token_mask, require_shape, safe_sqrt, tied_groups
from grpo_jax.rl.advantages import masked_whiten


def _reverse_scan_tokens(step, init, *token_arrays):
  """Runs step(carry, per-token column tuple) from t = T-1 down to 0; returns the (B, T)
  stacked outputs. Each token array is (B, T); step sees (B,) slices."""
  columns = tuple(jnp.swapaxes(x, 0, 1) for x in token_arrays)
  _, out = jax.lax.scan(step, init, columns, reverse=True)
  return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), out)


def discounted_returns(token_rewards: jax.Array, mask: jax.Array, gamma: float) -> jax.Array:
  """G_t = sum_{k >= t, m_k} gamma^(k - t) r_k per row (0 where ~m), by the reverse recursion

      G_t = r_t + gamma * G_next(t),   G after the row's last masked-in token = 0

  where next(t) is the next masked-in token (module docstring: exact for prefix masks).
  """
  mask = as_token_mask(mask, token_rewards)
  rewards = jnp.where(mask, token_rewards.astype(jnp.float32), 0.0)

  def step(future, column):
    r, m = column
    g = r + gamma * future
    return jnp.where(m, g, future), jnp.where(m, g, 0.0)

  return _reverse_scan_tokens(step, jnp.zeros(rewards.shape[0], jnp.float32), rewards, mask)


def reinforce_pp_advantages(token_rewards: jax.Array, mask: jax.Array, gamma: float = 1.0,
                            eps: float = 1e-8) -> jax.Array:
  """REINFORCE++ (Hu 2025; verl's reinforce_plus_plus) per-token advantages.

      G_t = sum_{k >= t, m_k} gamma^(k - t) r_k                       (discounted_returns)
      A = (G - mu) / (sqrt(var) + eps)    over all masked-in tokens of the batch

  i.e. masked_whiten(G, mask, shift_mean=True, eps): masked mean and UNBIASED masked variance
  (sum m (G - mu)^2 / (n - 1), verl's n/(n-1) correction). token_rewards, mask: (B, T); the
  outcome reward sits on the last token (place_reward_on_last_token), a KL penalty may sit on
  every token.
  """
  returns = discounted_returns(token_rewards, mask, gamma)
  return masked_whiten(returns, mask, shift_mean=True, eps=eps)


def gae_advantages(token_rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float,
                   lam: float, whiten: bool = False, eps: float = 1e-8):
  """Generalised advantage estimation (Schulman et al. 2016) over the completion tokens.

      delta_t = r_t + gamma * V_next(t) - V_t
      A_t     = delta_t + gamma * lam * A_next(t)         (V and A after the last token = 0)
      R_t     = A_t + V_t                                  (value-function targets)

  with next(t) the next masked-in token (module docstring: exact for prefix masks). Returns
  (advantages, returns), both (B, T) and 0 where ~mask. whiten=True replaces the advantages
  (not the returns) by masked_whiten(A, mask, shift_mean=True, eps) over the batch.
  With gamma = lam = 1, A_t = sum_{k >= t, m_k} r_k - V_t (Monte-Carlo return minus value).
  """
  mask = as_token_mask(mask, token_rewards)
  require_shape("values", values, mask.shape)
  rewards = jnp.where(mask, token_rewards.astype(jnp.float32), 0.0)
  values = jnp.where(mask, values.astype(jnp.float32), 0.0)

  def step(carry, column):
    next_value, next_adv = carry
    r, v, m = column
    adv = r + gamma * next_value - v + gamma * lam * next_adv
    carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
    return carry, jnp.where(m, adv, 0.0)

  zeros = jnp.zeros(rewards.shape[0], jnp.float32)
  advantages = _reverse_scan_tokens(step, (zeros, zeros), rewards, values, mask)
  returns = jnp.where(mask, advantages + values, 0.0)
  if whiten:
    advantages = masked_whiten(advantages, mask, shift_mean=True, eps=eps)
  return advantages, returns


def process_advantages(step_rewards: jax.Array, step_end_index: jax.Array, step_mask: jax.Array,
                       group_size: int, token_mask: jax.Array, eps: float = 1e-6) -> jax.Array:
  """GRPO with process supervision (DeepSeekMath §4.1.3), per token.

  Completion i has steps j = 0..K-1 (valid where step_mask), step j ending at token
  step_end_index[i, j] (0-based position in the completion, inclusive) with reward r_{i,j}.

      mu, sd = mean, unbiased std of r over ALL valid steps of all G completions of the group
      r~_{i,j} = (r_{i,j} - mu) / (sd + eps)
      A_{i,t}  = sum_{valid j of i with step_end_index[i, j] >= t} r~_{i,j}     where token_mask

  A group with a single valid step has sd = 0 (so r~ = 0 there); an end index >= T counts as
  ending at or after every token, a negative one before all of them. step_*: (B, K),
  token_mask: (B, T).
  """
  if jnp.ndim(step_rewards) != 2:
    raise ValueError(f"step_rewards must be (B, K); got shape {tuple(jnp.shape(step_rewards))}.")
  require_shape("step_end_index", step_end_index, step_rewards.shape)
  require_shape("step_mask", step_mask, step_rewards.shape)
  if not jnp.issubdtype(jnp.asarray(step_end_index).dtype, jnp.integer):
    raise ValueError(f"step_end_index must hold integers; got {jnp.asarray(step_end_index).dtype}.")
  batch, num_steps = step_rewards.shape
  if group_size < 1 or batch % group_size:
    raise ValueError(f"{batch} rows cannot be split into groups of {group_size}.")
  if jnp.ndim(token_mask) != 2 or jnp.shape(token_mask)[0] != batch:
    raise ValueError(f"token_mask has shape {tuple(jnp.shape(token_mask))} but (B={batch}, T) "
                     f"was expected.")
  step_mask = jnp.asarray(step_mask).astype(bool)
  tokens = jnp.asarray(token_mask).astype(bool)
  length = tokens.shape[1]

  rewards = jnp.where(step_mask, step_rewards.astype(jnp.float32), 0.0)
  group_r = rewards.reshape(-1, group_size * num_steps)
  group_m = step_mask.reshape(-1, group_size * num_steps)
  count = jnp.sum(group_m, axis=1, keepdims=True).astype(jnp.float32)
  mean = jnp.sum(group_r, axis=1, keepdims=True) / jnp.maximum(count, 1.0)
  centred = jnp.where(group_m & ~tied_groups(group_r, group_m), group_r - mean, 0.0)
  var = jnp.sum(centred * centred, axis=1, keepdims=True) / jnp.maximum(count - 1.0, 1.0)
  normalised = (centred / (safe_sqrt(var) + eps)).reshape(batch, num_steps)

  # Drop each normalised reward at its end token (column T collects steps ending before token
  # 0), then a reverse cumulative sum gives every token the sum over steps ending at or after it.
  end = jnp.asarray(step_end_index)
  column = jnp.where(step_mask & (end >= 0), jnp.minimum(end, length - 1), length)
  at_end = jnp.zeros((batch, length + 1), jnp.float32).at[
      jnp.arange(batch)[:, None], column].add(jnp.where(step_mask, normalised, 0.0))
  advantages = jnp.cumsum(at_end[:, length - 1::-1], axis=1)[:, ::-1]
  return jnp.where(tokens, advantages, 0.0)
