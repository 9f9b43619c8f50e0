"""The decoder's attention arithmetic as pure functions: rotary position embeddings, grouped-query
attention on batched matmuls, and its causal query blocks for the teacher-forced passes
(models/decoder.py's Attention module calls them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rotary_embedding(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Applies RoPE in HF's rotate-half layout.

  With inv_freq_i = theta^(-2i/D), angle = position * inv_freq, cos/sin tiled twice over D:
      rope(x) = x * cos + rotate_half(x) * sin,  rotate_half([x1, x2]) = [-x2, x1].
  x: (B, T, H, D); positions: (B, T).
  """
  head_dim = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, T, D/2)
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # (B, T, 1, D)
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


def grouped_query_attention(q, k, v, mask, keys_transposed: bool = False):
  """softmax(q k^T / sqrt(D) + mask) v with kv heads shared by groups of query heads.

  q: (B, Tq, H, D); k, v: (B, Hkv, Tk, D) (head-major), or with keys_transposed k is
  (B, Hkv, D, Tk) (the sampler's cache layout); mask: (B, Tq, Tk) bool (True = may attend).
  Scores and softmax are float32. Returns (B, Tq, H, D).
  Both products are plain batched matmuls over (B, Hkv) with the G = H / Hkv query heads of a
  group and the Tq queries folded into one row axis: XLA:CPU hands that form to its fast
  matmul kernels, while the 5-d einsums it replaced ran as slow generic dots (several times
  slower per decode step).
  """
  batch, tq, heads, dim = q.shape
  kv_heads = k.shape[1]
  group = heads // kv_heads
  q = q.reshape(batch, tq, kv_heads, group, dim).transpose(0, 2, 3, 1, 4)
  q = q.reshape(batch, kv_heads, group * tq, dim)  # rows (g, t)
  scores = jnp.einsum("bhqd,bhdk->bhqk" if keys_transposed else "bhqd,bhkd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  scores = scores / jnp.sqrt(jnp.float32(dim))
  scores = scores.reshape(batch, kv_heads, group, tq, -1)
  scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bhqk,bhkd->bhqd", probs.reshape(batch, kv_heads, group * tq, -1), v)
  out = out.reshape(batch, kv_heads, group, tq, dim).transpose(0, 3, 1, 2, 4)
  return out.reshape(batch, tq, heads, dim)


# Teacher-forced passes (no cache) take their queries in blocks of this many, each block against
# the keys up to its last query's slot only (causal_blocked_attention).
QUERY_BLOCK = 128


def causal_blocked_attention(q, k, v, mask, offset: int, block: int = QUERY_BLOCK):
  """grouped_query_attention(q, k, v, mask) for queries at slots offset, offset + 1, ... under
  a causal mask (a query sees no slot past its own): the queries in blocks of `block`, each
  against keys [0, offset + its block's end) only. The keys left out are masked for every
  query of the block, weight exp(min - max) = 0 in the softmax, so the values are the same up
  to the order of float32 sums; on a 512-token completion after a 192-token prompt about a
  quarter of the score and softmax work is not done. k, v: (B, Hkv, Tk, D)."""
  num_queries, num_keys = q.shape[1], k.shape[2]
  if num_queries <= block:
    return grouped_query_attention(q, k, v, mask)
  outs = []
  for start in range(0, num_queries, block):
    stop = min(start + block, num_queries)
    keys = min(num_keys, offset + stop)
    outs.append(grouped_query_attention(q[:, start:stop], k[:, :, :keys], v[:, :, :keys],
                                        mask[:, start:stop, :keys]))
  return jnp.concatenate(outs, axis=1)
