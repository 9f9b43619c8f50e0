"""Packed completion tokens: the teacher-forced passes (reference, old log-probs, the update)
run their per-token work only on the completion tokens that exist.

A GRPO batch of B rows x N completion slots is mostly padding at the end of short rows (on
GSM8K with SmolLM2 about 30% of the slots). Projections, MLPs and the vocabulary projection act
on each token alone, so they may run on the C real tokens gathered into one (1, C, ...) array;
only attention needs the rows, and gets them back by a scatter (zeros at the unused slots,
which the mask hides) and returns to the packed form by a gather. C is a static capacity the
host chooses per step from the rows' lengths (`token_capacity`), rounded up to one of a few
values so that few shapes compile; index entries past the real tokens point one past the end
(B x T) and are dropped by the scatter and read as zeros by the gather.

The values are those of the unpacked pass up to float rounding (tests/test_packing.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def packed_index(mask: jax.Array, capacity: int) -> jax.Array:
  """(capacity,) int32: the row-major flat indices of mask's (B, T) True entries, then B x T
  (one past the end) for the rest. More True entries than `capacity` would be cut off:
  `token_capacity` bounds the count for every piece of rows the passes see."""
  flat = mask.reshape(-1)
  return jnp.nonzero(flat, size=capacity, fill_value=flat.shape[0])[0].astype(jnp.int32)


def pack_tokens(x: jax.Array, index: jax.Array) -> jax.Array:
  """(B, T, ...) -> (1, C, ...): the entries at `index` (zeros past the end)."""
  flat = x.reshape(-1, *x.shape[2:])
  return jnp.take(flat, index, axis=0, mode="fill", fill_value=0)[None]


def unpack_tokens(x: jax.Array, index: jax.Array, rows: int, length: int) -> jax.Array:
  """(1, C, ...) -> (rows, length, ...): each packed entry back at its slot, zeros elsewhere
  (entries whose index is past the end are dropped)."""
  flat = jnp.zeros((rows * length, *x.shape[2:]), x.dtype)
  return flat.at[index].set(x[0], mode="drop").reshape(rows, length, *x.shape[2:])


def token_capacity(lengths, rows_per_piece: int, width: int, buckets: int) -> int:
  """The packed capacity for pieces of `rows_per_piece` rows of `width` slots whose rows hold
  `lengths` tokens ((..., B) host integers; leading axes are seeds, each its own batch): the
  sum of the `rows_per_piece` largest lengths of any batch (the most any piece of that many
  rows can hold, however the update shuffles rows into minibatches), rounded up to a multiple
  of ceil(rows_per_piece x width / buckets) and at most rows_per_piece x width. A run
  therefore compiles at most `buckets` capacities."""
  lengths = np.minimum(np.asarray(lengths, np.int64), width).reshape(-1, np.shape(lengths)[-1])
  most = int(np.sort(lengths, axis=-1)[:, ::-1][:, :rows_per_piece].sum(axis=-1).max())
  full = rows_per_piece * width
  unit = math.ceil(full / buckets)
  return min(full, max(1, math.ceil(most / unit)) * unit)
