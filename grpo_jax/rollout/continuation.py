"""KV-cache continuation of multi-turn episodes (env.kv_continuation): each episode's KV cache
lives across its turns, so a turn runs only its new ids through the model, where the
re-prefilling loop (rollout/episodes/host.py) prefills the whole episode so far again every turn.

Layout: row b's ids (its prompt, then every id after it: sampled, closing, the environment's)
sit at cache slots 0, 1, 2, ... equal to their rotary positions, as positions_from_mask gives
them in the re-prefilled, left-padded input. `cached[b]` counts the ids whose keys and values
are in the cache. A turn (`continue_turn`, one jitted call) is

1. extend: the row's pending ids, ids[cached[b]:] (at the first turn its prompt; after it the
   last turn's final sampled id, which no decode step is sure to have forwarded, the closing
   end-of-turn id if the environment added one, and the environment's delta), run through the
   decoder in chunks of W ids at the per-row cache offsets cached[b] + cW (kv_cache.write_cache's
   per-row form); the logits at each row's last pending id are kept;
2. decode: token t of the turn drawn from those logits (t = 0) or from the forward of token
   t - 1 at slot end[b] + t - 1 (end = cached + pending), with token_uniforms(key, r, t): the
   same draws as the re-prefilled turn's sampler call, so the same tokens wherever the logits
   agree (they differ only by float rounding: the earlier ids' keys and values come from other
   passes). A row ends at EOS or its limit; an ended episode (`live` False) records nothing.

After the turn, cached[b] grows by the turn's sampled ids but its last.

Capacity: C = prompt width + N + max(W, max_new_tokens) slots, N the episode's ids after the
prompt. Every write stays inside it: a chunk writes W slots from an offset <= prompt + N, and a
row that ended early keeps being forwarded (ignored) at most max_new_tokens - 1 slots past its
end. So no write is ever clamped onto a row's filled slots. Slots at or past a row's end are
masked until a later pass writes them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from grpo_jax.models.decoder import decoder_apply
from grpo_jax.models.scoring import vocab_logits
from grpo_jax.parallel.choices import choose as platform_choice
from grpo_jax.rollout.engine import DecodeState, Recorded, draw, read_params
from grpo_jax.rollout.prefill import constrain_cache

CHUNK = 32  # W: the extension's ids per forward pass


def cache_capacity(prompt_width: int, max_completion_tokens: int, max_new_tokens: int,
                   chunk: int = CHUNK) -> int:
  """C = prompt_width + N + max(W, max_new_tokens): the slots every write fits in (module
  docstring)."""
  return prompt_width + max_completion_tokens + max(chunk, max_new_tokens)


def _extend(params, cfg, cache, pending, pending_len, start, chunk: int, mesh, bounded: bool):
  """Writes row b's pending[b, :pending_len[b]] at cache slots start[b], start[b] + 1, ...
  in ceil(max pending_len / W) passes of W ids; returns (cache, the logits (B, V) at each row's
  last pending id, 0 for a row with none)."""
  batch, capacity = pending.shape
  slots = jnp.arange(capacity, dtype=jnp.int32)
  passes = (jnp.max(pending_len) + chunk - 1) // chunk

  def one(c, carry):
    cache, last = carry
    ids = jax.lax.dynamic_slice_in_dim(pending, c * chunk, chunk, axis=1)
    count = jnp.clip(pending_len - c * chunk, 0, chunk)
    offset = start + c * chunk
    positions = offset[:, None] + jnp.arange(chunk, dtype=jnp.int32)
    kv_mask = slots[None, :] < (offset + count)[:, None]
    hidden, cache = decoder_apply(cfg, params, ids, positions, kv_mask, cache, offset,
                                  project=False,
                                  read_limit=jnp.max(offset) + chunk if bounded else None)
    at = jnp.maximum(count - 1, 0)[:, None, None]
    logits = vocab_logits(params, cfg, jnp.take_along_axis(hidden, at, axis=1)[:, 0])
    ends_here = (count > 0) & (pending_len - c * chunk <= chunk)
    return constrain_cache(cache, mesh), jnp.where(ends_here[:, None], logits, last)

  return jax.lax.fori_loop(0, passes, one,
                           (cache, jnp.zeros((batch, cfg.vocab_size), jnp.float32)))


def _decode(params, sampling, cache, first_logits, end, key, limits, row_ids, live,
            bounded: bool):
  """The turn's decode loop (module docstring, step 2) over rollout/engine.py's DecodeState:
  (tokens, logprobs, mask) (B, M) and the cache."""
  s, cfg = sampling, sampling.model_cfg
  batch, new = end.shape[0], s.max_new_tokens
  slots = jnp.arange(cache[0]["v"].shape[2], dtype=jnp.int32)

  def record(state: DecodeState) -> DecodeState:
    live = ~state.done
    recorded = state.recorded.write(state.t, live, state.token, state.logp, None, s.pad_id)
    done = state.done | (state.token == s.eos_id) | (state.t + 1 >= limits)
    return state._replace(done=done, recorded=recorded)

  def body(state: DecodeState) -> DecodeState:
    state = record(state)
    slot = end + state.t
    logits, cache = decoder_apply(cfg, params, state.token[:, None], slot[:, None],
                                  slots[None, :] <= slot[:, None], state.cache, slot,
                                  read_limit=jnp.max(slot) + 1 if bounded else None)
    token, logp, _ = draw(logits[:, 0], key, row_ids, state.t + 1, s)
    return state._replace(t=state.t + 1, token=token, logp=logp,
                          cache=constrain_cache(cache, s.mesh))

  token, logp, _ = draw(first_logits, key, row_ids, 0, s)
  state = DecodeState(jnp.int32(0), token, logp, None, cache, ~live, None,
                      Recorded.empty(batch, new, s.pad_id))
  state = jax.lax.while_loop(lambda c: (c.t < new - 1) & ~jnp.all(c.done), body, state)
  out = record(state).recorded  # the last token, or a no-op (all done)
  return out.tokens, out.logprobs, out.mask, state.cache


@functools.partial(jax.jit, static_argnames=("sampling", "chunk"), donate_argnames=("cache",))
def continue_turn(params, cache, pending, pending_len, start, key, limits, row_ids, live, *,
                  sampling, chunk: int = CHUNK):
  """One turn of B episodes from their KV cache (module docstring): pending (B, C) int32 the
  ids not yet cached, pending_len (B,), start (B,) = cached; limits (B,) the turn's ids at most
  (clipped to [1, max_new_tokens]); row_ids (B,) the r of each row's draws; live (B,) bool.
  Returns (tokens (B, M) int32, logprobs (B, M) float32, mask (B, M) bool, the cache); the
  cache argument is donated (updated in place)."""
  return continue_turn_traced(read_params(params, sampling), cache, pending, pending_len,
                              start, key, limits, row_ids, live, sampling=sampling, chunk=chunk)


def continue_turn_traced(params, cache, pending, pending_len, start, key, limits, row_ids, live,
                         *, sampling, chunk: int = CHUNK):
  """continue_turn's body, not jitted (for a caller's own trace: rollout/episodes/pure_jax.py),
  on the params as every engine reads them (engine.read_params(params, sampling))."""
  cfg = sampling.model_cfg
  pending_len = jnp.where(live, pending_len, 0)
  # The passes' reads: bounded to the filled slots (attention.bounded_attention) under the
  # platform table's rollout.decode_loop "bounded", else the whole cache (read_limit None).
  bounded = platform_choice("rollout.decode_loop", sampling.decode_loop) == "bounded"
  cache, first_logits = _extend(params, cfg, constrain_cache(cache, sampling.mesh), pending,
                                pending_len, start, chunk, sampling.mesh, bounded)
  limits = jnp.clip(limits, 1, sampling.max_new_tokens)
  return _decode(params, sampling, cache, first_logits, start + pending_len, key, limits,
                 row_ids, live, bounded)
