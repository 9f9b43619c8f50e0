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

  In sorted order a token is kept iff the probability mass of the tokens before it is < p (the
  most likely token is always kept); the kept set is then every token whose logit is at least
  the last kept one's, so a token tied with it is kept too: a threshold set, which is what the
  keep-sampling mask records (`keep_record`). p >= 1 disables it.
  """
  if p >= 1.0:
    return logits
  sorted_logits = -jnp.sort(-logits, axis=-1)
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  kept = jnp.maximum(jnp.sum(mass_before < p, axis=-1, keepdims=True), 1)  # a sorted prefix
  cutoff = jnp.take_along_axis(sorted_logits, kept - 1, axis=-1)
  return jnp.where(logits >= cutoff, logits, NEG_INF)


def keep_record(scaled: jax.Array, filtered: jax.Array, top: jax.Array, log_z: jax.Array):
  """What the keep-sampling mask stores of one position's truncation (DeepSeek-V3.2, arXiv
  2512.02556 section 3.1): (cutoff, kept_logmass), each (B,) float32, for the set S of tokens
  that top-k / top-p left available, a threshold set of the sampling policy pi:

      cutoff        = (min_{v in S} log pi(v) + max_{v not in S} log pi(v)) / 2
                      (S = {v : log pi(v) >= cutoff}; NEG_INF when nothing was cut)
      kept_logmass  = log sum_{v in S} pi(v)          (<= 0; 0 when nothing was cut)

  The cutoff sits halfway between the last kept and the first cut token, so that a trainer's
  recomputed log-probs, equal up to float rounding, select the same set. scaled: the (B, V)
  logits / T; filtered: the same with the cut tokens at NEG_INF; top (B, 1) their max; log_z
  (B,) the log-partition of exp(scaled - top) over the whole vocabulary."""
  kept = filtered > NEG_INF / 2
  low = jnp.min(jnp.where(kept, scaled, jnp.inf), axis=-1)
  high = jnp.max(jnp.where(kept, NEG_INF, scaled), axis=-1)
  cutoff = jnp.where(high > NEG_INF / 2, (0.5 * (low + high) - top[:, 0]) - log_z, NEG_INF)
  kept_logmass = jnp.log(jnp.sum(jnp.where(kept, jnp.exp(scaled - top), 0.0), axis=-1)) - log_z
  return cutoff, jnp.minimum(kept_logmass, 0.0)


def first_argmax(x: jax.Array, top=None) -> jax.Array:
  """jnp.argmax over the last axis (the first index of the maximum), int32.

  Written as a max and a min-index reduction because XLA:CPU lowers jnp.argmax to a
  (value, index) pair reduction that does not vectorise: at a 32k vocabulary it is several
  times slower. A row containing NaN gives the last index instead of the NaN's.
  """
  if top is None:  # else the caller's jnp.max(x, axis=-1, keepdims=True)
    top = jnp.max(x, axis=-1, keepdims=True)
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == top, index, x.shape[-1] - 1), axis=-1)


SAMPLE_BLOCK = 128  # vocabulary block of the two-level inverse-CDF draw


def _last_positive(x: jax.Array) -> jax.Array:
  """Index of the last entry > 0 along the last axis (0 if none), int32."""
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(x > 0, index, 0), axis=-1)


def inverse_cdf_sample(weights: jax.Array, uniform: jax.Array, block: int = SAMPLE_BLOCK):
  """Draws index i of each row with probability weights[i] / sum(weights), by inverse CDF.

  weights: (B, V) >= 0 (unnormalised, e.g. exp(logits - max)); uniform: (B,) in [0, 1).
  With target u = uniform * total, the drawn index is the first i whose cumulative weight
  exceeds u. The cumulative sum is two-level: block sums (B, V / block) locate the block, a
  cumulative sum inside that one block locates the index, so the work is two passes over
  (B, V) and no (B, V) random numbers. Zero-weight entries are never drawn (rounding at the
  very end of a row falls back to its last positive entry). V is padded with zeros to a
  multiple of `block`.
  """
  batch, vocab = weights.shape
  pad = -vocab % block
  if pad:
    weights = jnp.pad(weights, ((0, 0), (0, pad)))
  blocks = weights.reshape(batch, -1, block)
  block_mass = jnp.sum(blocks, axis=-1)  # (B, nb)
  block_cdf = jnp.cumsum(block_mass, axis=-1)
  target = uniform * block_cdf[:, -1]
  chosen = jnp.minimum(jnp.sum(block_cdf <= target[:, None], axis=-1, dtype=jnp.int32),
                       _last_positive(block_mass))
  before = jnp.take_along_axis(block_cdf, jnp.maximum(chosen - 1, 0)[:, None], axis=-1)[:, 0]
  rest = target - jnp.where(chosen > 0, before, 0.0)
  inner = jnp.take_along_axis(blocks, chosen[:, None, None], axis=1)[:, 0]  # (B, block)
  inner_cdf = jnp.cumsum(inner, axis=-1)
  offset = jnp.minimum(jnp.sum(inner_cdf <= rest[:, None], axis=-1, dtype=jnp.int32),
                       _last_positive(inner))
  return chosen * block + offset


def token_uniforms(key: jax.Array, rows: jax.Array, steps) -> jax.Array:
  """The uniform that draws token steps[i] of rollout row rows[i]:

      u = uniform(fold_in(fold_in(key, row), step))  in [0, 1),

  a function of (the call's key, the row's index in the rollout, the token's position) only:
  never of the batch, the slot that decodes the row, the loop iteration or the mesh, so every
  engine (static, slot refill with any number of slots) draws the same tokens for the same
  rows. rows (B,) int32; steps (B,) or a scalar. key: one key, or one per row (B,) (rows of
  one call at different turns of their episodes: rollout/episodes/async_turns.py)."""
  steps = jnp.broadcast_to(jnp.asarray(steps, jnp.int32), rows.shape)
  if jnp.ndim(key) > 1 and not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)  # raw (B, 2) keys (jax.random.PRNGKey's): the same bits
  if jnp.ndim(key) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.vmap(lambda k, r, t: token_uniforms(k, r[None], t[None])[0])(key, rows, steps)
  draw = lambda r, t: jax.random.uniform(  # noqa: E731
      jax.random.fold_in(jax.random.fold_in(key, r), t), (), jnp.float32)
  return jax.vmap(draw)(rows, steps)


def truncates(temperature: float, top_k: int, top_p: float, vocab: int) -> bool:
  """Whether sampling with these settings draws from a truncated set (top-k or top-p active):
  when `choose_tokens(..., keep=True)` returns a record."""
  return temperature != 0.0 and (0 < top_k < vocab or top_p < 1.0)


def choose_tokens(logits: jax.Array, uniform, temperature: float, top_k: int,
                  top_p: float, keep: bool = False):
  """Samples one token per row and returns (tokens, logprobs, kept), kept None unless asked.

  The log-prob is that of the policy pi = softmax(logits / temperature) over the full
  vocabulary (top-k/top-p only restrict which tokens can be drawn), which is what the trainer
  recomputes:  log pi(t) = (z_t - max z) - log sum_v exp(z_v - max z),  z = logits / T,
  computed without materialising the (B, V) log-softmax. temperature == 0 is greedy
  (`first_argmax`) with log-probs of softmax(logits); `uniform` is then unused (None is
  fine). Sampling draws from the (filtered) softmax by inverse CDF with one uniform per row,
  uniform (B,) in [0, 1) (`token_uniforms`, `inverse_cdf_sample`): on CPU at a 32k vocabulary
  this is about 8x faster than the Gumbel-max draw of jax.random.categorical, which needs
  B x V random numbers and two logarithms each. logits: (B, V) float32.

  keep=True (the keep-sampling mask, when sampling with top-k or top-p): kept = `keep_record`'s
  (cutoff, kept_logmass) of each row's truncation; the tokens and log-probs are unchanged.
  """
  scaled = logits if temperature in (0.0, 1.0) else logits / temperature
  top = jnp.max(scaled, axis=-1, keepdims=True)
  weights = jnp.exp(scaled - top)
  log_z = jnp.log(jnp.sum(weights, axis=-1))
  kept = None
  if temperature == 0.0:
    tokens = first_argmax(scaled, top)
  else:
    if truncates(temperature, top_k, top_p, logits.shape[-1]):
      filtered = top_p_filter(top_k_filter(scaled, top_k), top_p)
      weights = jnp.exp(filtered - top)  # the most likely token is always kept: same max
      if keep:
        kept = keep_record(scaled, filtered, top, log_z)
    tokens = inverse_cdf_sample(weights, uniform)
  chosen = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
  logprobs = (chosen - top[:, 0]) - log_z
  return tokens, logprobs, kept
