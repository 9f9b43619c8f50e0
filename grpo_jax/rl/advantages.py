"""Advantage estimators: rewards in, per-completion or per-token advantages out.

Rows are grouped contiguously: rows [g*G, (g+1)*G) are the G completions of prompt g.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def group_normalized_advantages(rewards: jax.Array, group_size: int, eps: float = 1e-6,
                                scale_by_std: bool = True) -> jax.Array:
  """GRPO outcome advantages (DeepSeekMath §4.1.2), one per completion.

      A_i = (r_i - mean_group(r)) / (std_group(r) + eps)

  with the unbiased (n-1) standard deviation of the group; scale_by_std=False gives
  r_i - mean_group(r) (Dr. GRPO). rewards: (B,) with B = num_prompts * group_size.
  """
  if rewards.ndim != 1 or rewards.shape[0] % group_size:
    raise ValueError(f"rewards of shape {rewards.shape} cannot be split into groups of "
                     f"{group_size}; expected (num_prompts * group_size,).")
  groups = rewards.astype(jnp.float32).reshape(-1, group_size)
  centred = groups - groups.mean(axis=1, keepdims=True)
  if scale_by_std:
    if group_size < 2:
      raise ValueError("group_size=1 has no group standard deviation; use group_size >= 2.")
    centred = centred / (groups.std(axis=1, ddof=1, keepdims=True) + eps)
  return centred.reshape(-1)


def broadcast_to_tokens(sequence_values: jax.Array, mask: jax.Array) -> jax.Array:
  """(B,) -> (B, N): each completion's value on each of its tokens, 0 on masked positions."""
  return jnp.where(mask.astype(bool), sequence_values[:, None], 0.0)
