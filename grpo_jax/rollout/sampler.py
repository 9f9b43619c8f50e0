"""The sampler: one jitted, pure function from (params, prompts, key) to a `Rollout`.

prefill (one forward pass over the left-padded prompts, filling the KV cache), then a
`lax.while_loop` of single-token decode steps that ends when every row has emitted EOS or the
completion limit is reached. Shapes are static: prompts (B, P), completions (B, N).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import Decoder, init_cache, positions_from_mask
from grpo_jax.rollout.sampling import choose_tokens


class Rollout(NamedTuple):
  """Completions of B = prompts x G rows (groups contiguous)."""
  prompt_tokens: jax.Array  # (B, P) int32, left-padded
  prompt_mask: jax.Array  # (B, P) bool
  completion_tokens: jax.Array  # (B, N) int32, pad after EOS
  completion_mask: jax.Array  # (B, N) bool, True up to and including EOS
  logprobs: jax.Array  # (B, N) float32, log pi_sample(token), 0 where masked
  truncated: jax.Array  # (B,) bool, hit N tokens without EOS


def _constrain_cache(cache, mesh):
  """KV cache rows over the batch axes and kv heads over `tensor` (when they divide)."""
  if mesh is None:
    return cache
  from grpo_jax.parallel.mesh import spec_for  # the one place that knows the mesh rules
  def place(x):
    spec = spec_for(("batch", None, "kv_heads", None), x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
  return jax.tree.map(place, cache)


@functools.partial(jax.jit, static_argnames=(
    "model_cfg", "max_new_tokens", "temperature", "top_k", "top_p", "eos_id", "pad_id",
    "mesh"))
def generate(params, prompt_tokens, prompt_mask, key, *, model_cfg: ModelConfig,
             max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, eos_id: int, pad_id: int, mesh=None) -> Rollout:
  """Samples up to `max_new_tokens` tokens after each left-padded prompt row.

  With a `mesh`, the KV cache is laid out by the mesh rules (rows over data/fsdp, kv heads
  over tensor); params and prompts carry their own shardings in.
  """
  model = Decoder(model_cfg)
  batch, prompt_len = prompt_tokens.shape
  total = prompt_len + max_new_tokens
  prompt_mask = prompt_mask.astype(bool)
  kv_mask = jnp.concatenate([prompt_mask, jnp.zeros((batch, max_new_tokens), bool)], axis=1)
  cache = _constrain_cache(init_cache(model_cfg, batch, total), mesh)
  logits, cache = model.apply({"params": params}, prompt_tokens,
                              positions_from_mask(prompt_mask), kv_mask, cache, 0)
  next_position = jnp.sum(prompt_mask, axis=1).astype(jnp.int32)  # (B,)

  def cond(carry):
    step, _, _, done, *_ = carry
    return (step < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    step, last_logits, cache, done, kv_mask, tokens_out, logp_out, mask_out = carry
    token, logp = choose_tokens(last_logits, jax.random.fold_in(key, step), temperature,
                                top_k, top_p)
    live = ~done
    token = jnp.where(live, token, pad_id)
    tokens_out = tokens_out.at[:, step].set(token)
    logp_out = logp_out.at[:, step].set(jnp.where(live, logp, 0.0))
    mask_out = mask_out.at[:, step].set(live)
    kv_mask = kv_mask.at[:, prompt_len + step].set(live)
    done = done | (token == eos_id)
    logits, cache = model.apply({"params": params}, token[:, None],
                                (next_position + step)[:, None], kv_mask, cache,
                                prompt_len + step)
    cache = _constrain_cache(cache, mesh)
    return (step + 1, logits[:, 0], cache, done, kv_mask, tokens_out, logp_out, mask_out)

  carry = (jnp.int32(0), logits[:, -1], cache, jnp.zeros((batch,), bool), kv_mask,
           jnp.full((batch, max_new_tokens), pad_id, jnp.int32),
           jnp.zeros((batch, max_new_tokens), jnp.float32),
           jnp.zeros((batch, max_new_tokens), bool))
  _, _, _, done, _, tokens_out, logp_out, mask_out = jax.lax.while_loop(cond, body, carry)
  return Rollout(prompt_tokens, prompt_mask, tokens_out, mask_out, logp_out, ~done)
