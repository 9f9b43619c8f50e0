"""The prefill both engines start from: one forward pass over the left-padded prompts into the
KV cache, each prompt once, its cache rows repeated for its G samples (prefix sharing), and the
cache's layout on a mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import decoder_apply, positions_from_mask
from grpo_jax.models.kv_cache import init_cache, share_prompt_cache
from grpo_jax.parallel.mesh import prefill_rules, spec_for


def constrain_cache(cache, mesh):
  """KV cache (B, kv_heads, ...): rows over the batch axes of the active rules (the sampler's:
  data x fsdp x expert x context) and kv heads over `tensor` (each only when it divides)."""
  if mesh is None:
    return cache
  def place(x):
    axes = ("batch", "kv_heads", None, None)
    spec = spec_for(axes, x.shape, mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
  return jax.tree.map(place, cache)


def repeat_rows(tree, group_size: int, axis: int = 0):
  """Each row of every array repeated group_size times along `axis` (groups contiguous)."""
  if group_size == 1:
    return tree
  return jax.tree.map(lambda x: jnp.repeat(x, group_size, axis=axis), tree)


def first_positions(prompt_mask, inputs=None):
  """(B / G,) int32: the rotary id of each prompt's completion token 0."""
  if inputs is None:
    return jnp.sum(prompt_mask, axis=1).astype(jnp.int32)
  return inputs.next_position.astype(jnp.int32)


def prefill(params, prompt_tokens, prompt_mask, *, model_cfg: ModelConfig,
            max_new_tokens: int, mesh=None, group_size: int = 1, cache_slots: int = 0,
            shared_prompt: bool = False, record_routes: bool = False, inputs=None):
  """One forward pass over the left-padded prompts (B / G, P) into a cache of P + N slots (or
  `cache_slots`, >= P, if given: the static engine grows it segment by segment) for their
  B = prompts x G sample rows.

  Returns (logits of the last prompt position (B, V), cache, kv_mask (B, P + N)); only the last
  position is projected onto the vocabulary. Each prompt is computed once; its cache rows,
  logits and mask are then repeated G = group_size times (prefix sharing). With a `mesh`, the
  cache is laid out by the mesh rules (`constrain_cache`).
  shared_prompt: the prompts' cache is not repeated but shared (kv_cache.share_prompt_cache):
  the rows' own cache has `cache_slots` - P (or N) slots, and kv_mask is the pair (the prompts'
  (B / G, P), the rows' own (B, N)), as the decoder takes it with that cache.
  record_routes (a mixture of experts): returns a fourth value, the prompt tokens' experts
  (B, P, L, k) int32 (models/moe.py), repeated G times like the cache.
  inputs: the prompts' PromptInputs (models/prompt_inputs.py; a vision-language prompt's
  embeddings and rotary ids), None for text prompts.
  """
  prompts, prompt_len = prompt_tokens.shape
  prompt_mask = prompt_mask.astype(bool)
  slots = cache_slots or prompt_len + max_new_tokens
  cache = init_cache(model_cfg, prompts, prompt_len if shared_prompt else slots)
  with prefill_rules(prompt_len):  # a row's tokens over `context`, when they divide by it
    positions = positions_from_mask(prompt_mask) if inputs is None else inputs.positions
    out = decoder_apply(
        model_cfg, params, prompt_tokens, positions, prompt_mask, cache, 0,
        logits_window=(prompt_len - 1, 1), record_routing=record_routes,
        prefix_embeddings=None if inputs is None else inputs.embeddings)
  (logits, cache), routing = out if record_routes else (out, None)
  routes = () if routing is None else (repeat_rows(routing["routes"], group_size),)
  rows = prompts * group_size
  unfilled = jnp.zeros((rows, max_new_tokens), bool)  # the completions' N slots
  if shared_prompt:
    cache = share_prompt_cache(cache, init_cache(model_cfg, rows, slots - prompt_len))
    kv_mask = (prompt_mask, unfilled)
  else:
    cache = repeat_rows(cache, group_size)
    kv_mask = jnp.concatenate([repeat_rows(prompt_mask, group_size), unfilled], axis=1)
  return (repeat_rows(logits[:, 0], group_size), constrain_cache(cache, mesh), kv_mask, *routes)
