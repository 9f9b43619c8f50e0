"""The static engine: all B rows decode together until every row has ended (see
rollout/sampler.py for what both engines promise)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import decoder_apply
from grpo_jax.models.kv_cache import grow_cache
from grpo_jax.rollout.prefill import constrain_cache, first_positions, prefill, repeat_rows
from grpo_jax.rollout.sampling import choose_tokens, token_uniforms
from grpo_jax.rollout.types import DecodeStats, Rollout, finish


# rollout.decode_loop: how the static engine's decode steps read a cache that fills as they go.
# "segments": runs of decode_block steps, the cache grown between them, each step reading the
# whole cache of its segment (no copy; one compiled copy of the decode step per segment);
# "bounded": one loop, each step reading the blocks below its filled slot (one copy of the
# decode step; on the CPU each block read is a copy). The platform table picks one
# (parallel/platform.py, "auto").
DECODE_LOOPS = ("segments", "bounded")


def decode_segments(max_new_tokens: int, decode_block: int) -> list:
  """The decode loop's segment ends: decode steps 0 .. N - 2 (token t + 1 is chosen after the
  forward of token t) in segments of `decode_block` steps; a segment ending at step e reads
  cache slots [0, P + e). decode_block <= 0: one segment (every step reads all P + N slots)."""
  last = max_new_tokens - 1
  if decode_block <= 0 or last <= 0:
    return [max(last, 0)]
  return [min(end, last) for end in range(decode_block, last + decode_block, decode_block)]


def generate_static(params, prompt_tokens, prompt_mask, key, row_limits, *,
                    model_cfg: ModelConfig, max_new_tokens: int, temperature: float,
                    top_k: int, top_p: float, eos_id: int, pad_id: int, mesh, group_size: int,
                    decode_block: int, keep_mask: bool = False,
                    record_routes: bool = False,
                    decode_loop: str = "segments", row_ids=None,
                    inputs=None) -> tuple[Rollout, DecodeStats]:
  """The static engine: all B rows decode together until every row has ended (EOS or its
  limit). The loop carries the chosen token, not the (B, V) logits, and runs the decode
  forwards in segments of `decode_block` steps that read only the filled cache
  (`decode_segments`); the last token is recorded after them. With a `mesh`, the KV cache is
  laid out by the mesh rules (rows over data/fsdp, kv heads over tensor); params and prompts
  carry their own shardings in. keep_mask: also record each token's truncation
  (sampling.keep_record) in the Rollout's keep_cutoff and kept_logmass. record_routes (a
  mixture of experts): record every token's experts in the Rollout's routes (B, P + N, L, k):
  the prompt's from the prefill, completion token t's from the decode step that reads it (the
  last token is never read: its entry is 0).
  decode_loop="bounded": one decode loop over a cache of every slot, each step's attention
  reading only its filled blocks (attention.bounded_attention, the bound a traced value), so
  the program holds one copy of the decode step whatever `decode_block` (DECODE_LOOPS).
  inputs: the prompts' PromptInputs (models/prompt_inputs.py), None for text prompts.
  """
  prompt_len = prompt_tokens.shape[1]
  prompt_mask = prompt_mask.astype(bool)
  bounded = decode_loop == "bounded"
  segments = decode_segments(max_new_tokens, 0 if bounded else decode_block)
  # G > 1: the G rows of a prompt share its cache (prefill's shared_prompt), so that a decode
  # step reads each prompt's keys once; the rows' own slots then start at 0, not at P.
  shared = group_size > 1 and not model_cfg.sliding_window  # (a window needs per-row slots)
  first_slot = 0 if shared else prompt_len
  # The cache holds P + end slots in the segment ending at `end` and grows between segments:
  # a decode step's attention then reads its whole cache, where a slice of a longer one was a
  # copy of the filled part in every step (XLA:CPU materialises it; 2/3 of the attention's
  # memory traffic at 700 slots).
  logits, cache, kv_mask, *prompt_routes = prefill(
      params, prompt_tokens, prompt_mask, model_cfg=model_cfg, max_new_tokens=max_new_tokens,
      mesh=mesh, group_size=group_size, cache_slots=prompt_len + segments[0],
      shared_prompt=shared, record_routes=record_routes, inputs=inputs)
  prompts_kv_mask, kv_mask = kv_mask if shared else (None, kv_mask)
  next_position = repeat_rows(first_positions(prompt_mask, inputs), group_size)  # (B,)
  prompt_tokens, prompt_mask = repeat_rows((prompt_tokens, prompt_mask), group_size)
  batch = prompt_tokens.shape[0]
  if row_ids is None:  # (the r of each row's draws; sampler.Sampling.with_stats)
    row_ids = jnp.arange(batch, dtype=jnp.int32)
  choose = lambda lg, step: choose_tokens(  # noqa: E731
      lg, token_uniforms(key, row_ids, step), temperature, top_k, top_p, keep_mask)

  def record(step, token, logp, kept, done, kv_mask, outs):
    """Writes token `step` of the live rows (pad elsewhere); returns the updated state."""
    tokens_out, logp_out, mask_out, kept_out = outs[:4]
    live = ~done
    token = jnp.where(live, token, pad_id)
    if kept is not None:
      kept_out = tuple(o.at[:, step].set(jnp.where(live, k, 0.0))
                       for o, k in zip(kept_out, kept))
    outs = (tokens_out.at[:, step].set(token),
            logp_out.at[:, step].set(jnp.where(live, logp, 0.0)),
            mask_out.at[:, step].set(live), kept_out, *outs[4:])
    kv_mask = kv_mask.at[:, first_slot + step].set(live)
    return token, done | (token == eos_id) | (step + 1 >= row_limits), kv_mask, outs

  def cond(end, carry):
    step, done = carry[0], carry[5]
    return (step < end) & ~jnp.all(done)

  def body(end, carry):
    step, token, logp, kept, cache, done, kv_mask, outs = carry
    token, done, kv_mask, outs = record(step, token, logp, kept, done, kv_mask, outs)
    # Slots >= P + end are empty in this segment: the decoder reads the first kv_len of them.
    kv_len = first_slot + end
    read = (prompts_kv_mask, kv_mask[:, :kv_len]) if shared else kv_mask[:, :kv_len]
    out = decoder_apply(model_cfg, params, token[:, None], (next_position + step)[:, None],
                        read, cache, first_slot + step, record_routing=record_routes,
                        read_limit=first_slot + step + 1 if bounded else None)
    (logits, cache), routing = out if record_routes else (out, None)
    if record_routes:  # completion token `step`'s experts
      outs = (*outs[:4], outs[4].at[:, step].set(routing["routes"][:, 0]))
    cache = constrain_cache(cache, mesh)
    token, logp, kept = choose(logits[:, 0], step + 1)
    return (step + 1, token, logp, kept, cache, done, kv_mask, outs)

  token, logp, kept = choose(logits, 0)
  zeros = lambda: jnp.zeros((batch, max_new_tokens), jnp.float32)  # noqa: E731
  outs = (jnp.full((batch, max_new_tokens), pad_id, jnp.int32), zeros(),
          jnp.zeros((batch, max_new_tokens), bool), None if kept is None else (zeros(), zeros()))
  if record_routes:
    prompt_routes = prompt_routes[0]
    outs += (jnp.zeros((batch, max_new_tokens, *prompt_routes.shape[2:]), jnp.int32),)
  carry = (jnp.int32(0), token, logp, kept, cache, jnp.zeros((batch,), bool), kv_mask, outs)
  for end in segments:
    if end <= 0:  # one token (N = 1): no decode step runs, and a row's own cache has no slot
      continue
    cache = constrain_cache(grow_cache(carry[4], first_slot + end), mesh)
    carry = carry[:4] + (cache,) + carry[5:]
    carry = jax.lax.while_loop(functools.partial(cond, end), functools.partial(body, end),
                               carry)
  step, token, logp, kept, _, done, kv_mask, outs = carry
  # The loop stops at step N - 1 or once every row is done; recording at `step` is then either
  # the last token or a no-op (all rows done: pad, mask False).
  _, _, _, outs = record(step, token, logp, kept, done, kv_mask, outs)
  tokens_out, logp_out, mask_out, kept_out = outs[:4]
  routes = (jnp.concatenate([prompt_routes, outs[4]], axis=1) if record_routes else None)
  rollout = finish(prompt_tokens, prompt_mask, tokens_out, mask_out, logp_out, eos_id, kept_out,
                   routes)
  slot_steps = batch * jnp.max(jnp.sum(mask_out, axis=1)).astype(jnp.int32)
  return rollout, DecodeStats(slot_steps)
