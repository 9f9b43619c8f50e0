"""Shape checks shared by the RL maths: every mismatch is one ValueError sentence, never a
silent broadcast."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def require_shape(name: str, array: jax.Array, shape: tuple) -> None:
  """Raises unless array.shape == shape exactly."""
  if tuple(jnp.shape(array)) != tuple(shape):
    raise ValueError(f"{name} has shape {tuple(jnp.shape(array))} but {tuple(shape)} was "
                     f"expected.")


def as_token_mask(mask: jax.Array, like: jax.Array, name: str = "mask") -> jax.Array:
  """The (B, T) mask as bool, after checking that it matches `like`, a (B, T) array."""
  if jnp.ndim(like) != 2:
    raise ValueError(f"per-token inputs must be (B, T); got shape {tuple(jnp.shape(like))}.")
  require_shape(name, mask, jnp.shape(like))
  return jnp.asarray(mask).astype(bool)


def require_groups(rewards: jax.Array, group_size: int, min_size: int = 1,
                   name: str = "rewards") -> None:
  """Raises unless rewards is (num_prompts * group_size,) with group_size >= min_size."""
  if group_size < 1 or jnp.ndim(rewards) != 1 or jnp.shape(rewards)[0] % group_size:
    raise ValueError(f"{name} of shape {tuple(jnp.shape(rewards))} cannot be split into "
                     f"groups of {group_size}; expected (num_prompts * group_size,).")
  if group_size < min_size:
    raise ValueError(f"group_size={group_size} is too small here; use group_size >= "
                     f"{min_size}.")


def tied_groups(groups: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """(n, 1) bool: True where every (masked-in) value of a row of groups (n, G) is the same. A
  tied group carries no signal, so the estimators set its centred values to exactly 0: the
  rounding of its mean (XLA sums, then scales by 1 / G) would otherwise become one, divided by
  a standard deviation of 0 + eps (8 rewards of 0.7: advantages of 0.056), and any gradient
  that is not exactly 0 moves Adam by a whole step."""
  hi = groups if mask is None else jnp.where(mask, groups, -jnp.inf)
  lo = groups if mask is None else jnp.where(mask, groups, jnp.inf)
  return jnp.max(hi, axis=1, keepdims=True) == jnp.min(lo, axis=1, keepdims=True)


def safe_sqrt(x: jax.Array) -> jax.Array:
  """sqrt(x) for x >= 0 whose gradient at x == 0 is 0 instead of inf (so never nan)."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)
