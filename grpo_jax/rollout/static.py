"""The static engine: all B rows decode together until every row has ended (rollout/engine.py
says what every engine promises)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from grpo_jax.models.decoder import decoder_apply
from grpo_jax.models.kv_cache import grow_cache
from grpo_jax.parallel.choices import choose
from grpo_jax.rollout.engine import DecodeState, Recorded, Settings, draw, generator
from grpo_jax.rollout.prefill import constrain_cache, first_positions, prefill, repeat_rows
from grpo_jax.rollout.types import DecodeStats, Rollout, finish


# rollout.decode_loop: how the static engine's decode steps read a cache that fills as they go.
# "segments": runs of decode_block steps, the cache grown between them, each step reading the
# whole cache of its segment (no copy; one compiled copy of the decode step per segment);
# "bounded": one loop, each step reading the blocks below its filled slot (one copy of the
# decode step; on the CPU each block read is a copy). The platform table picks one
# (parallel/platform.py, "auto").


def decode_segments(max_new_tokens: int, decode_block: int) -> list:
  """The decode loop's segment ends: decode steps 0 .. N - 2 (token t + 1 is chosen after the
  forward of token t) in segments of `decode_block` steps; a segment ending at step e reads
  cache slots [0, P + e). decode_block <= 0: one segment (every step reads all P + N slots)."""
  last = max_new_tokens - 1
  if decode_block <= 0 or last <= 0:
    return [max(last, 0)]
  return [min(end, last) for end in range(decode_block, last + decode_block, decode_block)]


@generator("static")
def generate_static(params, prompt_tokens, prompt_mask, key, row_limits, *,
                    sampling: Settings, row_ids=None, inputs=None) -> tuple[Rollout, DecodeStats]:
  """The static engine (rollout/engine.py's protocol): all B rows decode together until every
  row has ended (EOS or its limit). The loop carries the chosen token, not the (B, V) logits,
  and runs the decode forwards in segments of `decode_block` steps that read only the filled
  cache (`decode_segments`; sampling.decode_loop "bounded": one loop, engine.DECODE_LOOPS); the last
  token is recorded after them. With a `mesh`, the KV cache is laid out by the mesh rules (rows
  over data/fsdp, kv heads over tensor); params and prompts carry their own shardings in.
  sampling.keep_mask: also record each token's truncation (sampling.keep_record) in the
  Rollout's keep_cutoff and kept_logmass. sampling.record_routes (a mixture of experts): record
  every token's experts in the Rollout's routes: the prompt's from the prefill, completion
  token t's from the decode step that reads it (the last token is never read: its entry is 0).
  """
  s, model_cfg, mesh = sampling, sampling.model_cfg, sampling.mesh
  prompt_len = prompt_tokens.shape[1]
  prompt_mask = prompt_mask.astype(bool)
  bounded = choose("rollout.decode_loop", s.decode_loop) == "bounded"
  segments = decode_segments(s.max_new_tokens, 0 if bounded else s.decode_block)
  # G > 1: the G rows of a prompt share its cache (prefill's shared_prompt), so that a decode
  # step reads each prompt's keys once; the rows' own slots then start at 0, not at P.
  shared = s.group_size > 1 and not model_cfg.sliding_window  # (a window: per-row slots)
  first_slot = 0 if shared else prompt_len
  # The cache holds P + end slots in the segment ending at `end`, growing between segments: a decode
  # step's attention reads its whole cache, as a slice of a longer one is a copy of the filled part
  # in every step (XLA:CPU materialises it; 2/3 of the attention's memory traffic at 700 slots).
  logits, cache, kv_mask, *prompt_routes = prefill(
      params, prompt_tokens, prompt_mask, model_cfg=model_cfg, max_new_tokens=s.max_new_tokens,
      mesh=mesh, group_size=s.group_size, cache_slots=prompt_len + segments[0],
      shared_prompt=shared, record_routes=s.record_routes, inputs=inputs)
  prompts_kv_mask, kv_mask = kv_mask if shared else (None, kv_mask)
  next_position = repeat_rows(first_positions(prompt_mask, inputs), s.group_size)  # (B,)
  prompt_tokens, prompt_mask = repeat_rows((prompt_tokens, prompt_mask), s.group_size)
  batch = prompt_tokens.shape[0]
  if row_ids is None:  # (the r of each row's draws; sampler.Sampling.with_stats)
    row_ids = jnp.arange(batch, dtype=jnp.int32)

  def record(state: DecodeState) -> DecodeState:
    """Writes token t of the live rows (pad elsewhere); the rows that end there are done."""
    live = ~state.done
    token = jnp.where(live, state.token, s.pad_id)
    recorded = state.recorded.write(state.t, live, token, state.logp, state.kept, s.pad_id)
    done = state.done | (token == s.eos_id) | (state.t + 1 >= row_limits)
    return state._replace(token=token, done=done,
                          kv_mask=state.kv_mask.at[:, first_slot + state.t].set(live),
                          recorded=recorded)

  def body(end, state: DecodeState) -> DecodeState:
    state = record(state)
    step = state.t
    # Slots >= P + end are empty in this segment: the decoder reads the first kv_len of them.
    kv_len = first_slot + end
    read = (prompts_kv_mask, state.kv_mask[:, :kv_len]) if shared else state.kv_mask[:, :kv_len]
    out = decoder_apply(model_cfg, params, state.token[:, None], (next_position + step)[:, None],
                        read, state.cache, first_slot + step, record_routing=s.record_routes,
                        read_limit=first_slot + step + 1 if bounded else None)
    (logits, cache), routing = out if s.record_routes else (out, None)
    recorded = state.recorded  # completion token `step`'s experts
    if routing is not None:
      recorded = recorded.write_routes(step, routing["routes"][:, 0])
    token, logp, kept = draw(logits[:, 0], key, row_ids, step + 1, s, s.keep_mask)
    return state._replace(t=step + 1, token=token, logp=logp, kept=kept,
                          cache=constrain_cache(cache, mesh), recorded=recorded)

  token, logp, kept = draw(logits, key, row_ids, 0, s, s.keep_mask)
  route_shape = prompt_routes[0].shape[2:] if s.record_routes else None
  state = DecodeState(jnp.int32(0), token, logp, kept, cache, jnp.zeros((batch,), bool),
                      kv_mask, Recorded.empty(batch, s.max_new_tokens, s.pad_id,
                                              kept is not None, route_shape))
  for end in segments:
    if end <= 0:  # one token (N = 1): no decode step runs, and a row's own cache has no slot
      continue
    state = state._replace(cache=constrain_cache(grow_cache(state.cache, first_slot + end),
                                                 mesh))
    state = jax.lax.while_loop(
        lambda c, end=end: (c.t < end) & ~jnp.all(c.done), functools.partial(body, end), state)
  # The loop stops at step N - 1 or once every row is done; recording at `t` is then either
  # the last token or a no-op (all rows done: pad, mask False).
  out = record(state).recorded
  rollout = finish(prompt_tokens, prompt_mask, out, s.eos_id, *prompt_routes)
  slot_steps = batch * jnp.max(jnp.sum(out.mask, axis=1)).astype(jnp.int32)
  return rollout, DecodeStats(slot_steps)
