"""Rule-based rewards on token ids (pure jnp, so they also run inside jit)."""

from __future__ import annotations

import jax.numpy as jnp

from grpo_jax.rewards.registry import register_reward


@register_reward("exact_match", kind="tokens")
def exact_match_reward(completion_tokens, completion_mask, target_tokens, target_mask):
  """1.0 iff the completion is exactly the target token sequence (answer then <eos>), else 0.

  A completion that stops early, runs on, or was truncated without <eos> scores 0. All
  inputs (B, N); returns (B,) float32 in {0, 1}.
  """
  completion_mask = completion_mask.astype(bool)
  target_mask = target_mask.astype(bool)
  same_tokens = jnp.where(target_mask, completion_tokens == target_tokens, True)
  same_length = completion_mask == target_mask
  return jnp.all(same_tokens & same_length, axis=-1).astype(jnp.float32)


def token_step_rewards(completion_tokens, completion_mask, target_tokens, target_mask):
  """Process rewards for token-by-token answers: step t is completion token t, rewarded 1 if
  it equals target token t (0 past the target's end), ending at token index t.

  Returns (step_rewards (B, N) float32, step_end_index (B, N) int32, step_mask (B, N) bool).
  """
  completion_mask = completion_mask.astype(bool)
  right = (completion_tokens == target_tokens) & target_mask.astype(bool)
  step_rewards = jnp.where(completion_mask, right, False).astype(jnp.float32)
  end_index = jnp.broadcast_to(jnp.arange(completion_tokens.shape[1], dtype=jnp.int32),
                               completion_tokens.shape)
  return step_rewards, end_index, completion_mask
