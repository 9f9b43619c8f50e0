"""Reward shaping that depends on the completion, not on its correctness."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def overlong_penalty(lengths: jax.Array, max_length: int, buffer: int, factor: float):
  """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), in tokens:

      R(|y|) = 0                                         |y| <= L_max - L_buf
             = ((L_max - L_buf) - |y|) / L_buf * factor  L_max - L_buf < |y| <= L_max
             = -factor                                   |y| > L_max

  lengths: (B,) completion lengths; returns (B,) float32 penalties (<= 0) to add to rewards.
  """
  if not 0 < buffer <= max_length:
    raise ValueError(f"overlong buffer {buffer} must be in (0, max_length={max_length}].")
  lengths = lengths.astype(jnp.float32)
  soft_start = max_length - buffer
  ramp = (soft_start - lengths) / buffer * factor
  return jnp.where(lengths <= soft_start, 0.0, jnp.where(lengths <= max_length, ramp, -factor))
