"""KV-cache continuation in decode slots, the host side of every continued episode (the
lock-step turns of rollout/episodes/host.py with S = B, the asynchronous turns of
rollout/episodes/async_turns.py with S <= B): the B episodes' caches live in one (B + 1)-row
cache (row B a scratch row), and a call continues up to S of them, whichever are ready, each
at its own turn:

  gather   the S chosen rows of the cache into an S-row cache (an unfilled slot takes the
           scratch row, not live)
  turn     rollout/continuation.continue_turn on those rows, with one key per row,
           fold_in(key, turn of the row's episode), so token t of turn k of episode r is drawn
           with token_uniforms(fold_in(key, k), r, t): the lock-step loop's draws
  scatter  the S rows back (the scratch row may be written several times: it is never read)

So an episode waiting on its tool holds no decode slot; it keeps its cache rows and resumes
with only its new ids (the closing id and the environment's delta) run through the model.
Every call has one compiled shape (S rows, the cache's C slots).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.kv_cache import init_cache
from grpo_jax.rollout.continuation import CHUNK, cache_capacity, continue_turn


@functools.partial(jax.jit, static_argnames=("sampling", "chunk"), donate_argnames=("cache",))
def continue_slots(params, cache, slot_rows, pending, pending_len, start, key, turns, limits,
                   row_ids, live, *, sampling, chunk: int = CHUNK):
  """continue_turn on the cache rows slot_rows (S,) (module docstring); turns (S,) each row's
  turn index k (its key fold_in(key, k)). Returns (tokens, logprobs, mask) (S, M) and the
  cache (donated, updated in place)."""
  rows = jax.tree.map(lambda c: jnp.take(c, slot_rows, axis=0), cache)
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, turns)
  tokens, logprobs, mask, rows = continue_turn(params, rows, pending, pending_len, start, keys,
                                               limits, row_ids, live, sampling=sampling,
                                               chunk=chunk)
  cache = jax.tree.map(lambda c, r: c.at[slot_rows].set(r), cache, rows)
  return tokens, logprobs, mask, cache


class SlotTurns:
  """The host side: B episodes' cache and cached counts, S decode slots. Called with the
  indices of up to S ready episodes, their ids so far, turns and limits, it returns their
  turn's (tokens, mask, logprobs) as numpy (len(which), M)."""

  def __init__(self, sampling, params, episodes: int, slots: int, prompt_width: int,
               max_completion_tokens: int, row_ids=None, chunk: int = CHUNK):
    self.sampling, self.params, self.chunk = sampling, params, chunk
    self.episodes, self.slots = episodes, max(1, min(int(slots), episodes))
    self.capacity = cache_capacity(prompt_width, max_completion_tokens,
                                   sampling.max_new_tokens, chunk)
    self.cache = init_cache(sampling.model_cfg, episodes + 1, self.capacity)
    self.cached = np.zeros(episodes, np.int32)
    self.row_ids = (np.arange(episodes, dtype=np.int32) if row_ids is None
                    else np.asarray(row_ids, np.int32))
    self.calls = 0

  def __call__(self, which: list, sequences: list, key, turns: list, limits: list):
    """which: the episodes' indices (at most S); sequences: their ids so far (prompt and
    after); turns: their turn indices; limits: the turn's ids at most."""
    s, count = self.slots, len(which)
    assert 0 < count <= s, (count, s)
    slot_rows = np.full(s, self.episodes, np.int32)  # unfilled slots: the scratch row
    slot_rows[:count] = which
    pending = np.zeros((s, self.capacity), np.int32)
    pending_len, start = np.zeros(s, np.int32), np.zeros(s, np.int32)
    for j, (b, seq) in enumerate(zip(which, sequences)):
      rest = seq[self.cached[b]:]
      pending[j, :len(rest)], pending_len[j], start[j] = rest, len(rest), self.cached[b]
    pad = lambda values, fill: np.asarray(list(values) + [fill] * (s - count), np.int32)  # noqa: E731
    live = np.arange(s) < count
    tokens, logprobs, mask, self.cache = continue_slots(
        self.params, self.cache, slot_rows, pending, pending_len, start, key, pad(turns, 0),
        pad(limits, 1), pad(self.row_ids[list(which)], 0), live, sampling=self.sampling,
        chunk=self.chunk)
    tokens, logprobs, mask = (a[:count] for a in jax.device_get((tokens, logprobs, mask)))
    sampled = mask.sum(axis=1).astype(np.int32)
    for j, b in enumerate(which):
      self.cached[b] += pending_len[j] + max(int(sampled[j]) - 1, 0)
    self.calls += 1
    return tokens, mask, logprobs
