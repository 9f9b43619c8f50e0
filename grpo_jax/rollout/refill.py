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
rules handle. The cost: each decode step's attention reads all P + N slots of every slot
(masked), where the static engine's segments read only the filled part.

Tokens do not depend on scheduling: token t of row r is drawn with token_uniforms(key, r, t),
as in the static engine, so any S gives the same tokens and masks (log-probs to rounding: a
matmul over S rows may round its last bits differently from one over B rows).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import decoder_apply
from grpo_jax.models.kv_cache import init_cache, map_cache
from grpo_jax.parallel import choices
from grpo_jax.rollout.prefill import (constrain_cache, first_positions, prompt_positions,
                                     repeat_rows)
from grpo_jax.rollout.types import DecodeStats, Rollout, finish
from grpo_jax.rollout.sampling import choose_tokens, token_uniforms, truncates


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
  """The loop state of the slot-refill engine: per-slot arrays and the call's outputs."""
  slot_steps: jax.Array  # () int32: slots x iterations so far
  next_row: jax.Array  # () int32: the first row not yet given a slot
  row: jax.Array  # (S,) int32: the row a slot decodes, -1 = free
  t: jax.Array  # (S,) int32: the position of its current token in the completion
  position: jax.Array  # (S,) int32: the rotary position of completion token 0 (prompt length)
  token: jax.Array  # (S,) int32: the current token (drawn, not yet recorded)
  logp: jax.Array  # (S,) float32: its log-prob
  kept: Any  # None, or its truncation's (cutoff, kept_logmass), (S,) float32 each
  cache: Any  # the KV cache of S rows and P + N slots (models/kv_cache.init_cache)
  kv_mask: jax.Array  # (S, P + N) bool
  outs: tuple  # (tokens (B, N) int32, logprobs (B, N) float32, mask (B, N) bool, None or
  # (keep_cutoff, kept_logmass) (B, N) float32)


def _compact(state: _Slots, slots: int, mesh) -> _Slots:
  """The busy slots moved to the first of `slots` slots (all busy ones fit), the rest dropped."""
  keep = jnp.argsort((state.row < 0).astype(jnp.int32), stable=True)[:slots]
  take = lambda x: jnp.take(x, keep, axis=0)  # noqa: E731
  cache = constrain_cache(jax.tree.map(take, state.cache), mesh)
  return state._replace(row=take(state.row), t=take(state.t), position=take(state.position),
                        token=take(state.token), logp=take(state.logp),
                        kept=jax.tree.map(take, state.kept), cache=cache,
                        kv_mask=take(state.kv_mask))


def generate_refill(params, prompt_tokens, prompt_mask, key, row_limits, *,
                    model_cfg: ModelConfig, max_new_tokens: int, temperature: float,
                    top_k: int, top_p: float, eos_id: int, pad_id: int, mesh, group_size: int,
                    decode_slots: int, keep_mask: bool = False,
                    row_ids=None, inputs=None) -> tuple[Rollout, DecodeStats]:
  """`sampler.sample` with S = decode_slots < B slots (see the module docstring); row_ids: the
  r of each row's draws (None: its index); inputs: the prompts' PromptInputs
  (models/prompt_inputs.py), None for text prompts."""
  num_prompts, prompt_len = prompt_tokens.shape
  new, group = max_new_tokens, group_size
  rows = num_prompts * group
  prompt_mask = prompt_mask.astype(bool)
  apply = lambda *a, **k: decoder_apply(model_cfg, params, *a, **k)  # noqa: E731
  draw_row = (lambda row: row) if row_ids is None else (lambda row: row_ids[row])  # noqa: E731
  choose = lambda logits, row, t: choose_tokens(  # noqa: E731
      logits, token_uniforms(key, draw_row(row), t), temperature, top_k, top_p, keep_mask)
  pick = lambda assign, new, old: jax.tree.map(  # noqa: E731  per-slot choice of a pytree
      lambda a, b: jnp.where(assign, a, b), new, old)

  # Each prompt prefilled once (prefix sharing); rows copy its cache when they start.
  first_logits, prompt_cache = apply(
      prompt_tokens, prompt_positions(prompt_mask, inputs), prompt_mask,
      init_cache(model_cfg, num_prompts, prompt_len), 0, logits_window=(prompt_len - 1, 1),
      prefix_embeddings=None if inputs is None else inputs.embeddings)
  first_logits, prompt_cache = first_logits[:, 0], constrain_cache(prompt_cache, mesh)
  prompt_lengths = first_positions(prompt_mask, inputs)

  def refill(state: _Slots) -> _Slots:
    """Every free slot takes the next pending row (in row order)."""
    slots = state.row.shape[0]
    free = state.row < 0
    candidate = state.next_row + jnp.cumsum(free.astype(jnp.int32)) - 1
    assign = free & (candidate < rows)
    new_row = jnp.minimum(candidate, rows - 1)
    prompt = new_row // group
    cache = constrain_cache(_copy_prompts(state.cache, prompt_cache, prompt, assign),
                            mesh)
    fresh_mask = jnp.concatenate([prompt_mask[prompt], jnp.zeros((slots, new), bool)], axis=1)
    first, first_logp, first_kept = choose(first_logits[prompt], new_row, 0)
    return state._replace(
        next_row=state.next_row + jnp.sum(assign, dtype=jnp.int32),
        row=jnp.where(assign, new_row, state.row), t=jnp.where(assign, 0, state.t),
        position=jnp.where(assign, prompt_lengths[prompt], state.position),
        token=jnp.where(assign, first, state.token), logp=jnp.where(assign, first_logp,
                                                                    state.logp),
        kept=pick(assign, first_kept, state.kept),
        cache=cache, kv_mask=jnp.where(assign[:, None], fresh_mask, state.kv_mask))

  def body(state: _Slots) -> _Slots:
    """Refill, record each busy slot's token, one decode forward of every slot."""
    state = jax.lax.cond(jnp.any(state.row < 0) & (state.next_row < rows), refill,
                         lambda s: s, state)
    row, t, token = state.row, state.t, state.token
    slots = row.shape[0]
    busy = row >= 0
    at_row = jnp.where(busy, row, rows)  # rows (out of range): the scatter drops it
    tokens_out, logp_out, mask_out, kept_out = state.outs
    if kept_out is not None:
      kept_out = tuple(o.at[at_row, t].set(k, mode="drop") for o, k in zip(kept_out,
                                                                             state.kept))
    outs = (tokens_out.at[at_row, t].set(token, mode="drop"),
            logp_out.at[at_row, t].set(state.logp, mode="drop"),
            mask_out.at[at_row, t].set(True, mode="drop"), kept_out)
    kv_mask = state.kv_mask.at[jnp.arange(slots), prompt_len + t].set(busy)
    safe_row = jnp.maximum(row, 0)
    ended = busy & ((token == eos_id) | (t + 1 >= row_limits[safe_row]))
    # Only the slots up to the furthest busy row's current one are read (in blocks).
    read_limit = prompt_len + jnp.max(jnp.where(busy, t, 0)) + 1
    logits, cache = apply(token[:, None], (state.position + t)[:, None], kv_mask, state.cache,
                          prompt_len + t, read_limit=read_limit)
    going = busy & ~ended
    following, following_logp, following_kept = choose(logits[:, 0], safe_row, t + 1)
    return state._replace(
        slot_steps=state.slot_steps + slots, row=jnp.where(ended, -1, row),
        t=jnp.where(going, t + 1, t), token=jnp.where(going, following, token),
        logp=jnp.where(going, following_logp, state.logp),
        kept=pick(going, following_kept, state.kept), cache=constrain_cache(cache, mesh),
        kv_mask=kv_mask, outs=outs)

  phases = shrink_phases(decode_slots, choices.choose("rollout.refill_shrink"))
  slots = phases[0]
  keeps = keep_mask and truncates(temperature, top_k, top_p, model_cfg.vocab_size)
  state = _Slots(
      jnp.int32(0), jnp.int32(0), jnp.full((slots,), -1, jnp.int32),
      *(jnp.zeros((slots,), jnp.int32) for _ in range(3)), jnp.zeros((slots,), jnp.float32),
      (jnp.zeros((slots,), jnp.float32),) * 2 if keeps else None,
      constrain_cache(init_cache(model_cfg, slots, prompt_len + new), mesh),
      jnp.zeros((slots, prompt_len + new), bool),
      (jnp.full((rows, new), pad_id, jnp.int32), jnp.zeros((rows, new), jnp.float32),
       jnp.zeros((rows, new), bool),
       (jnp.zeros((rows, new), jnp.float32),) * 2 if keeps else None))
  for i, slots in enumerate(phases):
    if i:
      state = _compact(state, slots, mesh)
    # A phase ends when every row is done, or (not the last) when no row is pending and the
    # busy slots fit in the next phase's.
    fits = phases[i + 1] if i + 1 < len(phases) else 0
    state = jax.lax.while_loop(
        lambda s, fits=fits: (s.next_row < rows) | (jnp.sum(s.row >= 0) > fits), body, state)
  tokens_out, logp_out, mask_out, kept_out = state.outs
  prompt_tokens, prompt_mask = repeat_rows((prompt_tokens, prompt_mask), group)
  rollout = finish(prompt_tokens, prompt_mask, tokens_out, mask_out, logp_out, eos_id, kept_out)
  return rollout, DecodeStats(state.slot_steps)
