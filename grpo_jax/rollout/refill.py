"""The slot-refill engine (continuous batching) inside one jitted program.

S = `decode_slots` decode slots work through the B = prompts x G rows of a call. Each loop
iteration

1. refills: every free slot takes the next pending row in row order (its prompt's cache rows
   copied from the shared prefill into the slot's region, its first token drawn from the
   prompt's last-position logits);
2. records each busy slot's current token at (row, t); a row ends at EOS or at its limit,
   freeing its slot for the next iteration;
3. runs one decode forward of all S slots, each at its own cache offset P + t, and draws each
   busy slot's next token.

So no slot waits for the longest row of a batch: the loop runs about sum(lengths) / S
iterations instead of max(length) iterations of all B rows. Once no row is pending and at most
half the slots are busy, the busy ones are compacted into half as many slots
(`shrink_phases`), so the last long rows do not keep idle slots running either.
`DecodeStats.slot_steps` counts the slots of each iteration, summed.

Why a fixed per-slot cache region and not a paged cache (vLLM's blocks + block table, Tunix's
ragged paged attention): every row of a call has the same capacity P + N, so a slot's region
of P + N slots is never too small and never fragments; the row that takes a slot simply
overwrites it. Paging pays when rows of very different capacities share memory, or prefixes
are shared in place; here the shared prefix is one prefill per prompt, copied into a slot
when a row starts (P x layers x kv bytes per refill, small next to the row's decode), and the
cache stays plain (S, kv_heads, ...) arrays of P + N slots that the existing decoder and mesh
rules handle. Each decode step's attention reads the slots up to the furthest busy row's
current one, in blocks (`read_limit`, attention.bounded_attention), masked per slot: a slot
whose row is younger reads the older row's span, where the static engine reads each step's
own filled part.

Tokens do not depend on scheduling: token t of row r is drawn with token_uniforms(key, r, t),
as in the static engine, so any S gives the same tokens and masks (log-probs to rounding: a
matmul over S rows may round its last bits differently from one over B rows).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.models.decoder import decoder_apply
from grpo_jax.models.kv_cache import init_cache, map_cache
from grpo_jax.parallel import choices
from grpo_jax.rollout.prefill import constrain_cache, first_positions, prefill, repeat_rows
from grpo_jax.rollout.engine import DecodeState, Recorded, Settings, draw, generator, select_rows
from grpo_jax.rollout.sampling import truncates
from grpo_jax.rollout.types import DecodeStats, Rollout, finish


def _copy_prompts(slot_cache, prompt_cache, prompt_of_slot, assign):
  """Slot cache with the prompt cache rows prompt_of_slot[s] in slots [0, P) of every slot s
  where assign[s]; the other slots unchanged."""
  def copy(slot, axis, prompt):
    prompt_len = prompt.shape[axis]
    gathered = jnp.take(prompt, prompt_of_slot, axis=0)
    head = jax.lax.slice_in_dim(slot, 0, prompt_len, axis=axis)
    select = assign.reshape((-1, 1, 1, 1))
    return jax.lax.dynamic_update_slice_in_dim(slot, jnp.where(select, gathered, head), 0,
                                               axis=axis)
  return map_cache(copy, slot_cache, prompt_cache)


def shrink_phases(slots: int, keep: float = 0.5, floor_ratio: int = 32) -> list:
  """The slot counts of the loop's phases: S, then each phase floor(keep x) the one before (at
  least one fewer), down to max(1, S // floor_ratio). Once no row is pending and a phase's busy
  slots fit in the next phase, they are compacted into it, so the tail of long rows does not
  keep running idle slots. Each phase is its own compiled loop: keep = 0.5 gives at most 6,
  0.75 about 13 at 64 slots (fewer idle slot-steps, more compiled copies of the decode step;
  the platform table's rollout.refill_shrink chooses)."""
  phases, floor = [slots], max(1, slots // floor_ratio)
  while phases[-1] > floor:
    following = min(phases[-1] - 1, int(phases[-1] * keep))
    if following < floor:
      break
    phases.append(following)
  return phases


class _Slots(NamedTuple):
  """The slot-refill engine's loop state: the decode state of S slots (rollout/engine.py; a
  slot's `done`: it is free, its t its row's completion position) and the row queue."""
  decode: DecodeState  # its recorded outputs are the call's B rows
  slot_steps: jax.Array  # () int32: slots x iterations so far
  next_row: jax.Array  # () int32: the first row not yet given a slot
  row: jax.Array  # (S,) int32: the row a busy slot decodes
  position: jax.Array  # (S,) int32: the rotary position of its completion token 0


def _compact(state: _Slots, slots: int, mesh) -> _Slots:
  """The busy slots moved to the first of `slots` slots (all busy ones fit), the rest dropped."""
  keep = jnp.argsort(state.decode.done.astype(jnp.int32), stable=True)[:slots]
  take = lambda x: jnp.take(x, keep, axis=0)  # noqa: E731
  d = state.decode
  decode = d._replace(t=take(d.t), token=take(d.token), logp=take(d.logp),
                      kept=jax.tree.map(take, d.kept),
                      cache=constrain_cache(jax.tree.map(take, d.cache), mesh),
                      done=take(d.done), kv_mask=take(d.kv_mask))
  return state._replace(decode=decode, row=take(state.row), position=take(state.position))


@generator("refill")
def generate_refill(params, prompt_tokens, prompt_mask, key, row_limits, *,
                    sampling: Settings, row_ids=None, inputs=None) -> tuple[Rollout, DecodeStats]:
  """The slot-refill engine (rollout/engine.py's protocol; the module docstring) with
  S = min(sampling.decode_slots, B) slots. sampling.record_routes: each
  prompt's experts from its prefill, completion token t's from the decode step that reads it,
  as the static engine records them."""
  s, model_cfg, mesh = sampling, sampling.model_cfg, sampling.mesh
  num_prompts, prompt_len = prompt_tokens.shape
  new, group = s.max_new_tokens, s.group_size
  rows = num_prompts * group
  prompt_mask = prompt_mask.astype(bool)
  draw_row = (lambda row: row) if row_ids is None else (lambda row: row_ids[row])  # noqa: E731
  choose = lambda logits, row, t: draw(logits, key, draw_row(row), t, s,  # noqa: E731
                                       s.keep_mask)
  apply = lambda *a, **k: decoder_apply(model_cfg, params, *a,  # noqa: E731
                                        record_routing=s.record_routes, **k)
  unpack = lambda out: out if s.record_routes else (out, None)  # noqa: E731

  # Each prompt prefilled once (prefix sharing), into a cache of its P slots; rows copy its
  # cache when they start.
  first_logits, prompt_cache, _, *prompt_routes = prefill(
      params, prompt_tokens, prompt_mask, model_cfg=model_cfg, max_new_tokens=new, mesh=mesh,
      cache_slots=prompt_len, record_routes=s.record_routes, inputs=inputs)
  prompt_lengths = first_positions(prompt_mask, inputs)

  def refill(state: _Slots) -> _Slots:
    """Every free slot takes the next pending row (in row order)."""
    d = state.decode
    slots = d.done.shape[0]
    candidate = state.next_row + jnp.cumsum(d.done.astype(jnp.int32)) - 1
    assign = d.done & (candidate < rows)
    new_row = jnp.minimum(candidate, rows - 1)
    prompt = new_row // group
    cache = constrain_cache(_copy_prompts(d.cache, prompt_cache, prompt, assign), mesh)
    fresh_mask = jnp.concatenate([prompt_mask[prompt], jnp.zeros((slots, new), bool)], axis=1)
    first = choose(first_logits[prompt], new_row, 0)
    decode = d._replace(
        t=jnp.where(assign, 0, d.t), token=jnp.where(assign, first[0], d.token),
        logp=jnp.where(assign, first[1], d.logp), kept=select_rows(assign, first[2], d.kept),
        cache=cache, done=d.done & ~assign,
        kv_mask=jnp.where(assign[:, None], fresh_mask, d.kv_mask))
    return state._replace(decode=decode,
                          next_row=state.next_row + jnp.sum(assign, dtype=jnp.int32),
                          row=jnp.where(assign, new_row, state.row),
                          position=jnp.where(assign, prompt_lengths[prompt], state.position))

  def body(state: _Slots) -> _Slots:
    """Refill, record each busy slot's token, one decode forward of every slot."""
    state = jax.lax.cond(jnp.any(state.decode.done) & (state.next_row < rows), refill,
                         lambda x: x, state)
    d, row = state.decode, state.row
    slots = row.shape[0]
    busy = ~d.done
    at_row = jnp.where(busy, row, rows)  # rows (out of range): the scatter drops it
    recorded = d.recorded.write(d.t, busy, d.token, d.logp, d.kept, s.pad_id, rows=at_row)
    kv_mask = d.kv_mask.at[jnp.arange(slots), prompt_len + d.t].set(busy)
    ended = busy & ((d.token == s.eos_id) | (d.t + 1 >= row_limits[row]))
    # Only the slots up to the furthest busy row's current one are read (in blocks).
    read_limit = prompt_len + jnp.max(jnp.where(busy, d.t, 0)) + 1
    (logits, cache), routing = unpack(apply(
        d.token[:, None], (state.position + d.t)[:, None], kv_mask, d.cache, prompt_len + d.t,
        read_limit=read_limit))
    if routing is not None:  # completion token t's experts (not the last position's: the
      # static engine never forwards that token)
      recorded = recorded.write_routes(d.t, routing["routes"][:, 0],
                                       rows=jnp.where(d.t < s.max_new_tokens - 1, at_row, rows))
    going = busy & ~ended
    following = choose(logits[:, 0], row, d.t + 1)
    decode = d._replace(
        t=jnp.where(going, d.t + 1, d.t), token=jnp.where(going, following[0], d.token),
        logp=jnp.where(going, following[1], d.logp), kept=select_rows(going, following[2], d.kept),
        cache=constrain_cache(cache, mesh), done=d.done | ended, kv_mask=kv_mask,
        recorded=recorded)
    return state._replace(decode=decode, slot_steps=state.slot_steps + slots)

  phases = shrink_phases(min(s.decode_slots, rows), choices.choose("rollout.refill_shrink"))
  slots = phases[0]
  keeps = s.keep_mask and truncates(s.temperature, s.top_k, s.top_p, model_cfg.vocab_size)
  route_shape = prompt_routes[0].shape[2:] if s.record_routes else None
  decode = DecodeState(
      jnp.zeros((slots,), jnp.int32), jnp.zeros((slots,), jnp.int32),
      jnp.zeros((slots,), jnp.float32), (jnp.zeros((slots,), jnp.float32),) * 2 if keeps else None,
      constrain_cache(init_cache(model_cfg, slots, prompt_len + new), mesh),
      jnp.ones((slots,), bool), jnp.zeros((slots, prompt_len + new), bool),
      Recorded.empty(rows, new, s.pad_id, keeps, route_shape))
  state = _Slots(decode, jnp.int32(0), jnp.int32(0), jnp.zeros((slots,), jnp.int32),
                 jnp.zeros((slots,), jnp.int32))
  for i, slots in enumerate(phases):
    if i:
      state = _compact(state, slots, mesh)
    # A phase ends when every row is done, or (not the last) when no row is pending and the
    # busy slots fit in the next phase's.
    fits = phases[i + 1] if i + 1 < len(phases) else 0
    state = jax.lax.while_loop(
        lambda x, fits=fits: (x.next_row < rows) | (jnp.sum(~x.decode.done) > fits), body,
        state)
  prompt_tokens, prompt_mask, prompt_routes = repeat_rows(
      (prompt_tokens, prompt_mask, prompt_routes), group)
  rollout = finish(prompt_tokens, prompt_mask, state.decode.recorded, s.eos_id, *prompt_routes)
  return rollout, DecodeStats(state.slot_steps)
