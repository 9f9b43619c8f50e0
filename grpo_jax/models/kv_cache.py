"""The sampler's KV cache: a tuple of per-layer dicts (the cached forwards, prefill and decode,
run the stacked layers unrolled, one cache per layer), its layout and the operations on it.

The keys are stored transposed, "kt" (B, kv_heads, head_dim, S), the values as "v"
(B, kv_heads, S, head_dim): a decode step's scores q k^T and its weighted sum of values are then
plain batched matmuls on the cache as it lies (models/attention.grouped_query_attention). With the
keys as (S, head_dim) rows XLA:CPU transposed the filled cache in every decode step. Slots are
axis 3 of the keys and axis 2 of the values (`CACHE_SLOT_AXIS`); `map_cache` hands each array
its slot axis, so code that copies, grows or writes slots never spells the layout out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig

Cache = tuple  # tuple of {"kt": (B, Hkv, D, S), "v": (B, Hkv, S, D)} per layer
# The slot axis of each cache array: the sampler's keys are stored transposed ("kt",
# init_cache); shared-prompt scoring's per-layer cache keeps them as "k" (B, Hkv, S, D).
CACHE_SLOT_AXIS = {"k": 2, "kt": 3, "v": 2}
SHARED_PROMPT = ("prompt_kt", "prompt_v")  # a shared-prompt cache's prompt part (below)


def init_cache(cfg: ModelConfig, batch: int, length: int) -> Cache:
  """A zeroed KV cache for `length` slots in the compute dtype: per layer the keys transposed,
  "kt" (B, kv_heads, head_dim, length), and the values, "v" (B, kv_heads, length, head_dim)."""
  shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
  keys = (batch, cfg.num_kv_heads, cfg.head_dim, length)
  return tuple({"kt": jnp.zeros(keys, cfg.dtype), "v": jnp.zeros(shape, cfg.dtype)}
               for _ in range(cfg.num_layers))


def write_cache(cache: jax.Array, x: jax.Array, offset, axis: int = 2) -> jax.Array:
  """cache (B, Hkv, S, D) with x (B, Hkv, T, D) written at slots [offset, offset + T) of
  `axis` (3 for the transposed keys, (B, Hkv, D, S)): one offset for every row (a scalar), or
  one per row ((B,) int32: the slot-refill sampler's rows are at different positions)."""
  x = x.astype(cache.dtype)
  if jnp.ndim(offset) == 0:
    return jax.lax.dynamic_update_slice_in_dim(cache, x, offset, axis=axis)
  return jax.vmap(lambda c, u, o: jax.lax.dynamic_update_slice_in_dim(c, u, o, axis=axis - 1))(
      cache, x, offset)


def map_cache(fn, *caches) -> Cache:
  """fn(array, slot_axis, *others) over a cache's arrays (and those of caches shaped like it),
  each told the axis of its slots (`CACHE_SLOT_AXIS`)."""
  return tuple({name: fn(layer[name], CACHE_SLOT_AXIS[name], *(c[i][name] for c in caches[1:]))
                for name in layer} for i, layer in enumerate(caches[0]))


def grow_cache(cache, slots: int):
  """The cache with empty slots appended up to `slots` slots (a shared prompt's part, whole
  from the prefill, as it is)."""
  def grow(c, axis):
    widths = [(0, 0)] * c.ndim
    widths[axis] = (0, slots - c.shape[axis])
    return jnp.pad(c, widths)
  return tuple({name: c if name in SHARED_PROMPT else grow(c, CACHE_SLOT_AXIS[name])
                for name, c in layer.items()} for layer in cache)


def share_prompt_cache(prompt_cache: Cache, rows_cache: Cache) -> Cache:
  """A shared-prompt cache: per layer the prompts' keys and values (B/G rows, P slots) as
  "prompt_kt" / "prompt_v" next to the B rows' own "kt" / "v" (their completions' slots).
  The decoder then attends each row to its prompt's slots and to its own
  (models/attention.shared_prompt_attention), reading a prompt's cache once for its G rows."""
  return tuple({"prompt_kt": p["kt"], "prompt_v": p["v"], **r}
               for p, r in zip(prompt_cache, rows_cache))
