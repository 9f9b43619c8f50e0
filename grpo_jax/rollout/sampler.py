"""The sampler: one jitted, pure function from (params, prompts, key) to a `Rollout`
(`sample`, which also returns its `DecodeStats`; `generate`, the Rollout alone).

prefill (one forward pass over the left-padded prompts, filling the KV cache), then
`lax.while_loop`s of single-token decode steps that end when every row has emitted EOS or the
completion limit is reached. Shapes are static: prompts (B / G, P), completions (B, N), so one
compilation serves every call of the same shapes and settings.

Prefix sharing: each prompt is prefilled once and its cache rows, last-position logits and
masks are repeated for its G samples (`group_size`), so prefill FLOPs scale with prompts, not
rows. Decode reads only what exists: the decode steps run in segments of `decode_block` steps,
and a segment's attention reads the first P + (its last step + 1) cache slots, not all P + N.
Neither changes a drawn token (tests/test_sampler_prefix.py). The KV cache is made inside the
one jitted call and carried through the loops, never an argument or a result, so XLA updates it
in place: there is no second copy to donate away (the cache's donation, in this form).

Tokens do not depend on scheduling: token t of row r (r = prompt x G + sample, the row's index
in the call's Rollout) is drawn with the uniform `token_uniforms(key, r, t)`, never with one
that depends on the batch, a slot or the loop. So the slot-refill engine (rollout/refill.py,
`decode_slots`: S slots, a finished row's slot takes the next pending row) draws the same
tokens as the static engine here, with any S, any batch split and any mesh
(tests/test_refill.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import decoder_apply, init_cache, positions_from_mask
from grpo_jax.rollout.sampling import choose_tokens, token_uniforms


class Rollout(NamedTuple):
  """Completions of B = prompts x G rows (groups contiguous)."""
  prompt_tokens: jax.Array  # (B, P) int32, left-padded
  prompt_mask: jax.Array  # (B, P) bool
  completion_tokens: jax.Array  # (B, N) int32, pad after EOS
  completion_mask: jax.Array  # (B, N) bool, True up to and including EOS
  logprobs: jax.Array  # (B, N) float32, log pi_sample(token), 0 where masked
  truncated: jax.Array  # (B,) bool, hit N tokens without EOS


def constrain_cache(cache, mesh):
  """KV cache (B, kv_heads, S, head_dim): rows over the batch axes (data x fsdp) and kv heads
  over `tensor` (each only when it divides)."""
  if mesh is None:
    return cache
  from grpo_jax.parallel.mesh import spec_for  # the one place that knows the mesh rules
  def place(x):
    axes = ("batch", "kv_heads", None, None)
    spec = spec_for((None,) * (x.ndim - 4) + axes, x.shape, mesh)  # (layers,) when scanned
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
  return jax.tree.map(place, cache)


def repeat_rows(tree, group_size: int, axis: int = 0):
  """Each row of every array repeated group_size times along `axis` (groups contiguous)."""
  if group_size == 1:
    return tree
  return jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=axis), tree)


def prefill(params, prompt_tokens, prompt_mask, *, model_cfg: ModelConfig,
            max_new_tokens: int, mesh=None, group_size: int = 1):
  """One forward pass over the left-padded prompts (B / G, P) into a cache of P + N slots for
  their B = prompts x G sample rows.

  Returns (logits of the last prompt position (B, V), cache, kv_mask (B, P + N)); only the last
  position is projected onto the vocabulary. Each prompt is computed once; its cache rows,
  logits and mask are then repeated G = group_size times (prefix sharing). With a `mesh`, the
  cache is laid out by the mesh rules (`constrain_cache`).
  """
  prompts, prompt_len = prompt_tokens.shape
  prompt_mask = prompt_mask.astype(bool)
  cache = init_cache(model_cfg, prompts, prompt_len + max_new_tokens)
  logits, cache = decoder_apply(
      model_cfg, params, prompt_tokens, positions_from_mask(prompt_mask), prompt_mask,
      cache, 0, logits_window=(prompt_len - 1, 1))
  layer_axis = 1 if model_cfg.scan_layers else 0  # stacked caches: (layers, rows, ...)
  cache = constrain_cache(repeat_rows(cache, group_size, layer_axis), mesh)
  kv_mask = jnp.concatenate([repeat_rows(prompt_mask, group_size),
                             jnp.zeros((prompts * group_size, max_new_tokens), bool)], axis=1)
  return repeat_rows(logits[:, 0], group_size), cache, kv_mask


def decode_segments(max_new_tokens: int, decode_block: int) -> list:
  """The decode loop's segment ends: decode steps 0 .. N - 2 (token t + 1 is chosen after the
  forward of token t) in segments of `decode_block` steps; a segment ending at step e reads
  cache slots [0, P + e). decode_block <= 0: one segment (every step reads all P + N slots)."""
  last = max_new_tokens - 1
  if decode_block <= 0 or last <= 0:
    return [max(last, 0)]
  return [min(end, last) for end in range(decode_block, last + decode_block, decode_block)]


class DecodeStats(NamedTuple):
  """How much decode work a sampler call spent: slot_steps = decode slots x loop iterations
  (an iteration records at most one token per slot), so useful tokens / slot_steps is the
  decode-slot utilisation."""
  slot_steps: jax.Array  # () int32


def row_limits_or_max(row_limits, rows: int, max_new_tokens: int) -> jax.Array:
  """(rows,) int32 per-row completion limits in [1, N] (N for every row when None)."""
  if row_limits is None:
    return jnp.full((rows,), max_new_tokens, jnp.int32)
  return jnp.clip(jnp.asarray(row_limits, jnp.int32), 1, max_new_tokens)


def finish(prompt_tokens, prompt_mask, tokens_out, mask_out, logp_out, eos_id: int) -> Rollout:
  """The Rollout of the recorded tokens: truncated = the row ended without emitting EOS."""
  ended_by_eos = jnp.any((tokens_out == eos_id) & mask_out, axis=1)
  return Rollout(prompt_tokens, prompt_mask, tokens_out, mask_out, logp_out, ~ended_by_eos)


SAMPLE_STATIC = ("model_cfg", "max_new_tokens", "temperature", "top_k", "top_p", "eos_id",
                 "pad_id", "mesh", "group_size", "decode_block", "decode_slots")


@functools.partial(jax.jit, static_argnames=SAMPLE_STATIC)
def sample(params, prompt_tokens, prompt_mask, key, row_limits=None, *,
           model_cfg: ModelConfig, max_new_tokens: int, temperature: float = 1.0,
           top_k: int = 0, top_p: float = 1.0, eos_id: int, pad_id: int, mesh=None,
           group_size: int = 1, decode_block: int = 0,
           decode_slots: int = 0) -> tuple[Rollout, DecodeStats]:
  """Samples up to `max_new_tokens` tokens (row r: up to row_limits[r]) for group_size rows per
  left-padded prompt row; returns (Rollout, DecodeStats).

  prompt_tokens (B / G, P); the Rollout has B = prompts x G rows, groups contiguous, its
  prompts repeated. Token t of row r is drawn with `token_uniforms(key, r, t)`, whichever
  engine runs: decode_slots in (0, B) runs the slot-refill engine (rollout/refill.py: S slots,
  a finished row's slot takes the next pending row), else the static one below (every row
  decoded until the last one ends). Both give the same tokens and masks.
  """
  rows = prompt_tokens.shape[0] * group_size
  limits = row_limits_or_max(row_limits, rows, max_new_tokens)
  if 0 < decode_slots < rows:
    from grpo_jax.rollout.refill import generate_refill  # noqa: PLC0415 (it imports this module)
    return generate_refill(params, prompt_tokens, prompt_mask, key, limits, model_cfg=model_cfg,
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           top_k=top_k, top_p=top_p, eos_id=eos_id, pad_id=pad_id, mesh=mesh,
                           group_size=group_size, decode_slots=decode_slots)
  return generate_static(params, prompt_tokens, prompt_mask, key, limits, model_cfg=model_cfg,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, eos_id=eos_id, pad_id=pad_id, mesh=mesh,
                         group_size=group_size, decode_block=decode_block)


def generate(params, prompt_tokens, prompt_mask, key, row_limits=None, **settings) -> Rollout:
  """`sample`'s Rollout alone (the same arguments)."""
  return sample(params, prompt_tokens, prompt_mask, key, row_limits, **settings)[0]


def generate_static(params, prompt_tokens, prompt_mask, key, row_limits, *,
                    model_cfg: ModelConfig, max_new_tokens: int, temperature: float,
                    top_k: int, top_p: float, eos_id: int, pad_id: int, mesh, group_size: int,
                    decode_block: int) -> tuple[Rollout, DecodeStats]:
  """The static engine: all B rows decode together until every row has ended (EOS or its
  limit). The loop carries the chosen token, not the (B, V) logits, and runs the decode
  forwards in segments of `decode_block` steps that read only the filled cache
  (`decode_segments`); the last token is recorded after them. With a `mesh`, the KV cache is
  laid out by the mesh rules (rows over data/fsdp, kv heads over tensor); params and prompts
  carry their own shardings in.
  """
  prompt_len = prompt_tokens.shape[1]
  prompt_mask = prompt_mask.astype(bool)
  logits, cache, kv_mask = prefill(params, prompt_tokens, prompt_mask, model_cfg=model_cfg,
                                   max_new_tokens=max_new_tokens, mesh=mesh,
                                   group_size=group_size)
  prompt_tokens, prompt_mask = repeat_rows((prompt_tokens, prompt_mask), group_size)
  batch = prompt_tokens.shape[0]
  row_ids = jnp.arange(batch, dtype=jnp.int32)
  next_position = jnp.sum(prompt_mask, axis=1).astype(jnp.int32)  # (B,)
  choose = lambda lg, step: choose_tokens(  # noqa: E731
      lg, token_uniforms(key, row_ids, step), temperature, top_k, top_p)

  def record(step, token, logp, done, kv_mask, outs):
    """Writes token `step` of the live rows (pad elsewhere); returns the updated state."""
    tokens_out, logp_out, mask_out = outs
    live = ~done
    token = jnp.where(live, token, pad_id)
    outs = (tokens_out.at[:, step].set(token),
            logp_out.at[:, step].set(jnp.where(live, logp, 0.0)),
            mask_out.at[:, step].set(live))
    kv_mask = kv_mask.at[:, prompt_len + step].set(live)
    return token, done | (token == eos_id) | (step + 1 >= row_limits), kv_mask, outs

  def cond(end, carry):
    step, _, _, _, done, *_ = carry
    return (step < end) & ~jnp.all(done)

  def body(end, carry):
    step, token, logp, cache, done, kv_mask, outs = carry
    token, done, kv_mask, outs = record(step, token, logp, done, kv_mask, outs)
    # Slots >= P + end are empty in this segment: the decoder reads the first kv_len of them.
    kv_len = prompt_len + end
    logits, cache = decoder_apply(model_cfg, params, token[:, None],
                                (next_position + step)[:, None], kv_mask[:, :kv_len], cache,
                                prompt_len + step)
    cache = constrain_cache(cache, mesh)
    token, logp = choose(logits[:, 0], step + 1)
    return (step + 1, token, logp, cache, done, kv_mask, outs)

  token, logp = choose(logits, 0)
  outs = (jnp.full((batch, max_new_tokens), pad_id, jnp.int32),
          jnp.zeros((batch, max_new_tokens), jnp.float32),
          jnp.zeros((batch, max_new_tokens), bool))
  carry = (jnp.int32(0), token, logp, cache, jnp.zeros((batch,), bool), kv_mask, outs)
  for end in decode_segments(max_new_tokens, decode_block):
    carry = jax.lax.while_loop(functools.partial(cond, end), functools.partial(body, end),
                               carry)
  step, token, logp, _, done, kv_mask, outs = carry
  # The loop stops at step N - 1 or once every row is done; recording at `step` is then either
  # the last token or a no-op (all rows done: pad, mask False).
  _, _, _, (tokens_out, logp_out, mask_out) = record(step, token, logp, done, kv_mask, outs)
  rollout = finish(prompt_tokens, prompt_mask, tokens_out, mask_out, logp_out, eos_id)
  slot_steps = batch * jnp.max(jnp.sum(mask_out, axis=1)).astype(jnp.int32)
  return rollout, DecodeStats(slot_steps)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """What a sampler call needs besides params, prompts and key: the model, the lengths and
  special tokens, the sampling policy, and the mesh (hashable: a jit-static value)."""
  model_cfg: ModelConfig
  max_new_tokens: int
  eos_id: int
  pad_id: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  mesh: Any = None
  group_size: int = 1  # sample rows per prompt row (prefix sharing)
  decode_block: int = 0  # decode steps per segment; <= 0: one segment reading all slots
  decode_slots: int = 0  # slot-refill engine with this many slots; 0 or >= rows: static

  @classmethod
  def of(cls, model_cfg: ModelConfig, task, rollout_cfg, mesh=None,
         max_new_tokens: int | None = None) -> "Sampling":
    """The rollout's sampling for a task (its eos / pad) and a config's rollout section, one
    row per prompt row (`grouped` for G)."""
    return cls(model_cfg, max_new_tokens or rollout_cfg.max_new_tokens, task.eos_id,
               task.pad_id, rollout_cfg.temperature, rollout_cfg.top_k, rollout_cfg.top_p,
               mesh, 1, getattr(rollout_cfg, "decode_block", 0),
               getattr(rollout_cfg, "decode_slots", 0))

  def greedy(self) -> "Sampling":
    """Greedy, one row per prompt."""
    return dataclasses.replace(self, temperature=0.0, top_k=0, top_p=1.0, group_size=1)

  def grouped(self, group_size: int) -> "Sampling":
    """group_size sampled rows per prompt row, the prompt prefilled once."""
    return dataclasses.replace(self, group_size=group_size)

  def __call__(self, params, prompt_tokens, prompt_mask, key) -> Rollout:
    """generate(params, prompt_tokens, prompt_mask, key) with these settings: prompts
    (B / G, P) -> a Rollout of B rows."""
    return self.with_stats(params, prompt_tokens, prompt_mask, key)[0]

  def with_stats(self, params, prompt_tokens, prompt_mask, key, row_limits=None):
    """sample(...) with these settings: (Rollout, DecodeStats)."""
    return sample(params, prompt_tokens, prompt_mask, key, row_limits,
                  **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

