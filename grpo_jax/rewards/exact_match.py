"""Rule-based rewards on token ids (pure jnp, so they also run inside jit)."""

from __future__ import annotations

import jax.numpy as jnp


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
