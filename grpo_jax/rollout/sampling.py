"""Per-step token choice: temperature, top-k and top-p (nucleus) filtering, as pure functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
  """Keeps the k largest logits of each row (ties at the k-th value kept), the rest -> -inf.

  k <= 0 or k >= vocab disables the filter.
  """
  if k <= 0 or k >= logits.shape[-1]:
    return logits
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  return jnp.where(logits >= kth, logits, NEG_INF)


def top_p_filter(logits: jax.Array, p: float) -> jax.Array:
  """Nucleus filter: keeps the smallest set of most-probable tokens whose mass reaches p.

  A token is kept iff the probability mass of the tokens strictly more likely than it
  (in sorted order) is < p, so the most likely token is always kept. p >= 1 disables it.
  """
  if p >= 1.0:
    return logits
  order = jnp.argsort(-logits, axis=-1)
  sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep_sorted = mass_before < p
  keep = jnp.zeros_like(keep_sorted).at[
      jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
  return jnp.where(keep, logits, NEG_INF)


def first_argmax(x: jax.Array) -> jax.Array:
  """jnp.argmax over the last axis (the first index of the maximum), int32.

  Written as a max and a min-index reduction because XLA:CPU lowers jnp.argmax to a
  (value, index) pair reduction that does not vectorise: at a 32k vocabulary it is several
  times slower. A row containing NaN gives the last index instead of the NaN's.
  """
  top = jnp.max(x, axis=-1, keepdims=True)
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == top, index, x.shape[-1] - 1), axis=-1)


def choose_tokens(logits: jax.Array, key: jax.Array, temperature: float, top_k: int,
                  top_p: float):
  """Samples one token per row and returns (tokens, logprobs).

  The log-prob is that of the policy pi = softmax(logits / temperature) over the full
  vocabulary (top-k/top-p only restrict which tokens can be drawn), which is what the trainer
  recomputes. temperature == 0 is greedy (argmax) with log-probs of softmax(logits).
  Sampling is the Gumbel-max draw of jax.random.categorical (the same tokens for the same key),
  with the faster `first_argmax`. logits: (B, V) float32.
  """
  if temperature == 0.0:
    tokens = first_argmax(logits)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
  else:
    scaled = logits / temperature
    filtered = top_p_filter(top_k_filter(scaled, top_k), top_p)
    tokens = first_argmax(filtered + jax.random.gumbel(key, filtered.shape, filtered.dtype))
    logprobs = jax.nn.log_softmax(scaled, axis=-1)
  return tokens, jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
