"""Multi-turn episodes of a pure-JAX environment (envs/calculator_jax.py) in one traced
program: `play_episodes` is `sample_episodes` (rollout/episodes/host.py) with the environment's reset
and step written in JAX, a lax.while_loop over turns (at most max_turns; it stops once every
episode is done, the later turns being no-ops) of the same sampler on fixed-shape arrays,
and no host round-trip per turn (it runs inside the fused iteration,
train/sources/fused_episodes.py).

Turn k of every episode, as the host loop does it:

  input    the prompt and the episode's ids so far, left-padded to the fixed `width`
  sample   sampling.with_stats(params, input, mask, fold_in(key, k), limits, row_ids):
           limits = N - ids so far (1 for an ended episode, whose token is ignored)
  append   the sampled ids (action_mask True); a turn cut by max_new_tokens without its
           end-of-turn token is closed by one (action_mask False); one cut by the episode's
           N ids ends it, truncated (reward 0)
  step     the environment reads the turn (its ids without the closing end-of-turn token):
           done or k + 1 = max_turns ends the episode with the step's reward; else its delta
           ids are appended (action_mask False), cut to the room left (no room: truncated)

So at the same key, rows and episode ids, and with the host's sampler input width equal to
`width` (sample_episodes(..., width_bucket=width) when width >= the longest episode), the
episodes are the host's id for id: tests/test_env_jax.py.

With kv_continuation, the sample step continues each row's KV cache instead
(rollout/continuation.py, as the host's SlotTurns): the cache and `cached` (B,) ride in
the loop's carry; row b's pending ids are (prompt ++ ids)[cached[b] : L + length[b]] (the
prompt at turn 0; then the last turn's final sampled id, the closing end-of-turn id if any,
the environment's delta), written at cache slots cached[b], ...; after the turn
cached[b] += pending + sampled - 1. With the same key fold_in(key, k), row ids and cache
capacity (prompt_width), the episodes are the host's sample_episodes(...,
kv_continuation=True): the same ids, log-probs to float rounding
(tests/test_env_jax_continuation.py).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.envs import calculator_jax
from grpo_jax.errors import ConfigError
from grpo_jax.models.kv_cache import init_cache
from grpo_jax.rollout.continuation import CHUNK, cache_capacity, continue_turn_traced
from grpo_jax.rollout.engine import read_params, select_rows
from grpo_jax.rollout.types import Rollout


class Episodes(NamedTuple):
  """The loop's carry: B episodes of at most N ids after the prompt."""
  ids: jax.Array  # (B, N) int32
  actions: jax.Array  # (B, N) bool: the policy's
  logprobs: jax.Array  # (B, N) float32
  length: jax.Array  # (B,) int32: ids so far
  done: jax.Array  # (B,) bool
  truncated: jax.Array  # (B,) bool
  reward: jax.Array  # (B,) float32
  turns: jax.Array  # (B,) int32
  env: calculator_jax.EnvState


def _write(buffer, start, values, count, fill=None):
  """buffer (B, N) with row b's values[b, :count[b]] written at start[b] (the rest dropped)."""
  b, n = buffer.shape
  offsets = jnp.arange(values.shape[1], dtype=jnp.int32)[None, :]
  where = jnp.where(offsets < count[:, None], start[:, None] + offsets, n)
  values = values if fill is None else jnp.full(values.shape, fill, buffer.dtype)
  return buffer.at[jnp.arange(b)[:, None], where].set(values.astype(buffer.dtype), mode="drop")


def left_padded(prompt, ids, length, width: int, pad_id: int):
  """(tokens, mask) (B, width): the prompt (B, L, all real) and ids[:length] (B, N),
  right-aligned; the left filled with pad_id. width >= L + N."""
  seq = jnp.concatenate([prompt, ids], axis=1)
  total = prompt.shape[1] + length
  k = jnp.arange(width, dtype=jnp.int32)[None, :] - (width - total)[:, None]
  mask = k >= 0
  tokens = jnp.take_along_axis(seq, jnp.clip(k, 0, seq.shape[1] - 1), axis=1)
  return jnp.where(mask, tokens, pad_id), mask


def _reprefilled(sampling, params, prompt, width: int, row_ids):
  """(sample, its start carry ()): sample(k, e, key, limits, carry) -> (tokens, mask,
  logprobs (B, M), carry), the sampler on the prompt and the ids so far, left-padded to
  `width` and prefilled whole."""
  def sample(k, e, key, limits, carry):
    tokens, mask = left_padded(prompt, e.ids, e.length, width, sampling.pad_id)
    out = sampling.with_stats(params, tokens, mask, jax.random.fold_in(key, k), limits,
                              row_ids)[0]
    return out.completion_tokens, out.completion_mask, out.logprobs, carry
  return sample, ()


def _continued(sampling, params, prompt, prompt_width: int, n: int, row_ids):
  """(sample, its start carry): sample(k, e, key, limits, (cache, cached)) -> (tokens, mask,
  logprobs (B, M), (cache, cached)), the rows' KV caches continued with their pending ids
  (module docstring); the start: an empty cache of cache_capacity(prompt_width, N, M) slots."""
  rows = prompt.shape[0]
  capacity = cache_capacity(prompt_width, n, sampling.max_new_tokens, CHUNK)
  split = read_params(params, sampling)  # once, not per turn
  j = jnp.arange(capacity, dtype=jnp.int32)[None, :]

  def sample(k, e, key, limits, carry):
    cache, cached = carry
    seq = jnp.concatenate([prompt, e.ids], axis=1)
    live = ~e.done
    pending_len = jnp.where(live, prompt.shape[1] + e.length - cached, 0)
    at = jnp.clip(cached[:, None] + j, 0, seq.shape[1] - 1)
    pending = jnp.where(j < pending_len[:, None], jnp.take_along_axis(seq, at, axis=1), 0)
    tokens, logprobs, mask, cache = continue_turn_traced(
        split, cache, pending, pending_len, cached, jax.random.fold_in(key, k), limits, row_ids,
        live, sampling=sampling, chunk=CHUNK)
    sampled = jnp.sum(mask, axis=1, dtype=jnp.int32)
    cached = jnp.where(live, cached + pending_len + jnp.maximum(sampled - 1, 0), cached)
    return tokens, mask, logprobs, (cache, cached)

  return sample, (init_cache(sampling.model_cfg, rows, capacity), jnp.zeros((rows,), jnp.int32))


def _advance(spec, sampling, n: int, k, e: Episodes, tokens, completion_mask, logprobs_out):
  """The episodes after turn k's sampled ids (module docstring: append, step)."""
  rows = tokens.shape[0]
  live = ~e.done
  count = jnp.where(live, jnp.sum(completion_mask, axis=1, dtype=jnp.int32), 0)
  ids = _write(e.ids, e.length, tokens, count)
  actions = _write(e.actions, e.length, completion_mask, count, fill=True)
  logprobs = _write(e.logprobs, e.length, logprobs_out, count)
  last = jnp.take_along_axis(tokens, jnp.maximum(count - 1, 0)[:, None], axis=1)[:, 0]
  ended = (count > 0) & (last == sampling.eos_id)
  length = e.length + count
  text = jnp.arange(tokens.shape[1])[None, :] < (count - ended)[:, None]
  close = live & ~ended & (length < n)  # the environment closes a turn cut by its cap
  ids = _write(ids, length, jnp.full((rows, 1), sampling.eos_id), close.astype(jnp.int32))
  length = length + close
  cut = live & ~ended & ~close
  stepping = live & ~cut
  env, delta, delta_len, reward, env_done = calculator_jax.step(spec, e.env, tokens, text)
  finish = stepping & (env_done | (k + 1 == spec.max_turns))
  goes_on = stepping & ~finish
  room = n - length
  appended = jnp.where(goes_on, jnp.minimum(delta_len, room), 0)
  ids = _write(ids, length, delta, appended)
  no_room = goes_on & (delta_len >= room)
  return Episodes(ids, actions, logprobs, length + appended, e.done | cut | finish | no_room,
                  e.truncated | cut | no_room, jnp.where(finish, reward, e.reward),
                  e.turns + live, select_rows(stepping, env, e.env))


def play_episodes(sampling, params, spec, a, b, key, max_completion_tokens: int,
                  prompt_width: int, width: int, episode_ids=None,
                  kv_continuation: bool = False):
  """(Rollout of the B episodes of the problems a * b, Episodes at their end). sampling: the
  turn's `Sampling` (group_size 1); prompt_width: the Rollout's prompt width (>= the prompt's
  ids; with kv_continuation also the cache's prompt slots, as the host's); width: every
  turn's sampler input width (>= prompt + N; unused with kv_continuation); episode_ids: each
  episode's r in its draws (None: its row); kv_continuation: continue each row's KV cache
  across turns instead of prefilling the episode again (module docstring). Traceable: call it
  inside jit."""
  n = max_completion_tokens
  env, prompt = calculator_jax.reset(spec, a, b)
  rows = prompt.shape[0]
  if prompt.shape[1] > prompt_width:
    raise ConfigError(f"an episode's first messages take {prompt.shape[1]} tokens, more than "
                      f"task.prompt_width={prompt_width}; raise it.")
  if prompt.shape[1] + n > width:
    raise ValueError(f"width={width} holds no prompt of {prompt.shape[1]} ids and {n} more.")
  row_ids = (jnp.arange(rows, dtype=jnp.int32) if episode_ids is None
             else jnp.asarray(episode_ids, jnp.int32))
  zeros = jnp.zeros((rows,), jnp.int32)
  start = Episodes(jnp.full((rows, n), sampling.pad_id, jnp.int32), jnp.zeros((rows, n), bool),
                   jnp.zeros((rows, n), jnp.float32), zeros, jnp.zeros((rows,), bool),
                   jnp.zeros((rows,), bool), jnp.zeros((rows,), jnp.float32), zeros, env)
  sample, carry = (_continued(sampling, params, prompt, prompt_width, n, row_ids)
                   if kv_continuation else _reprefilled(sampling, params, prompt, width, row_ids))

  def turn(state):
    k, e, carry = state
    limits = jnp.where(e.done, 1, jnp.maximum(n - e.length, 1))
    tokens, mask, logprobs, carry = sample(k, e, key, limits, carry)
    return k + 1, _advance(spec, sampling, n, k, e, tokens, mask, logprobs), carry

  def more(state):  # a turn after every episode is done changes nothing: skip it
    return (state[0] < spec.max_turns) & ~jnp.all(state[1].done)

  _, end, _ = jax.lax.while_loop(more, turn, (jnp.int32(0), start, carry))
  return as_rollout(prompt, end, prompt_width, sampling.pad_id), end


def as_rollout(prompt, e: Episodes, prompt_width: int, pad_id: int) -> Rollout:
  """The episodes as the host's Rollout: the prompt left-padded to prompt_width, the ids
  after it with completion_mask True on the first `length`."""
  rows, length = prompt.shape
  prompt_tokens = jnp.concatenate(
      [jnp.full((rows, prompt_width - length), pad_id, jnp.int32), prompt], axis=1)
  prompt_mask = jnp.arange(prompt_width)[None, :] >= prompt_width - length
  mask = jnp.arange(e.ids.shape[1])[None, :] < e.length[:, None]
  return Rollout(prompt_tokens, jnp.broadcast_to(prompt_mask, prompt_tokens.shape),
                 jnp.where(mask, e.ids, pad_id), mask, jnp.where(mask, e.logprobs, 0.0),
                 e.truncated, e.actions & mask)
