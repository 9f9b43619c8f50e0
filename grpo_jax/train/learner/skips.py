"""When an optimizer step is skipped: optax's `ShouldSkipUpdateFunction`s.

Each rule is `rule(updates, gradient_step, params) -> (should_skip, info)`, the signature of
optax's own `skip_not_finite` / `skip_large_updates`, so it works under
`optax.MultiSteps(optimizer, 1, should_skip_update_fn=rule)` as well as in the RL update's guard
(`state.guarded_apply`). A skipped step leaves the params AND the optimizer's state as they were:
moments and count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def has_signal(grads) -> jax.Array:
  """True iff any entry of any gradient leaf is not exactly 0 (a NaN counts as signal: the
  finiteness guard, not this one, refuses it)."""
  leaves = jax.tree.leaves(grads)
  if not leaves:
    return jnp.bool_(False)
  return jnp.any(jnp.array([jnp.any(g != 0) for g in leaves]))


def skip_without_signal(updates, gradient_step=None, params=None):
  """Skip an update whose gradient carries no signal:

      should_skip = (g_i == 0 for every entry i of every leaf)

  Why: with g = 0, Adam still moves.  m <- b1 m, v <- b2 v, count <- count + 1, and the step
  -lr * m_hat / (sqrt(v_hat) + eps) replays the last informative direction, under a learning
  rate that may still be warming up (the steps of a GRPO batch whose every group is tied at one
  reward, with no KL, entropy or value term: 20 such steps moved 1.5-3.1 % of each weight
  matrix's norm (benchmarks/RESULTS.md), and the policy's behaviour with it). AdamW's weight
  decay would shrink the weights too. Skipped, the step changes nothing.

  The count does not advance either: Adam's bias correction 1 / (1 - b^count) must count the
  gradients that went into the moments, and the learning-rate schedule then counts the updates
  that carried information (a run that finds its first signal at step 20 starts with the
  warm-up's small steps, not at the peak rate).

  Returns (should_skip, {"should_skip": ..., "no_signal": ...}) as optax's rules do.
  """
  del gradient_step, params
  should_skip = ~has_signal(updates)
  return should_skip, {"should_skip": should_skip, "no_signal": should_skip}
