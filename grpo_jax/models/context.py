"""Context parallelism in the decoder: a row's tokens split over the mesh's `context` axis
(parallel/mesh.py's logical axis "length") in the teacher-forced passes, their layout, and the
attention over the split rows.

Layouts (model.context_layout; "auto" = the platform table's, parallel/choices.py):
- "contiguous": device c of C holds tokens [c T/C, (c + 1) T/C).
- "zigzag": the row cut into 2C chunks, device c holding chunks c and 2C - 1 - c (the causal
  load balance of Megatron's and MaxText's context parallelism). Under a causal mask a device
  then has the same number of (query, key) pairs to compute as every other; contiguous, the
  last device has 2C - 1 times the first's.
The decoder permutes a row's embeddings, positions and mask into the layout's order before the
layers and back after them (`layout_order`), so every other op sees the row as it is; the
attention's mask holds causality by the tokens' own slots, whatever their order.

Attention over split rows: each device holds its own queries and every key and value (all
gathered over `context`):
- `split_sequence_attention` (XLA): the queries in blocks, each against every key. Every
  (query, key) pair is computed, so both layouts cost the same.
- `tpu_splash_context_attention` (TPU, model.attention_impl "pallas"): jax's Pallas splash
  kernel on each device's queries, which skips the key blocks that the causal mask hides
  entirely; here the zig-zag layout pays (benchmarks/context_balance.py counts the blocks).
"""

from __future__ import annotations

import concurrent.futures
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.attention import (attention_mask, score_divisor, sliding_window_mask,
                                       soft_cap)
from grpo_jax.models.embeddings import pad_tokens
from grpo_jax.parallel.mesh import LOGICAL_RULES, constrain, context_size, spec_for

# The queries of each device's share of a split row are taken in blocks of this many (each
# block's scores recomputed in the backward pass): split_sequence_attention.
SPLIT_QUERY_BLOCK = 128
# The splash kernel's query and key blocks (tokens): a device's share of a row is a multiple.
TPU_SPLASH_BLOCK = 128


def row_multiple(context: int, layout: str, attention_impl: str) -> int:
  """The length (tokens) that a split row is padded to a multiple of: C devices' equal shares;
  2C chunks for "zigzag"; for the splash kernel ("pallas") shares of whole 128-token blocks,
  with C^2 dividing the row (its mask's shards)."""
  multiple = context * (2 if layout == "zigzag" else 1)
  if attention_impl == "pallas":
    multiple = math.lcm(multiple, context * TPU_SPLASH_BLOCK, context * context)
  return multiple


def layout_order(length: int, context: int, layout: str) -> np.ndarray | None:
  """order (length,) int32: order[p] = the slot of the token at place p of the split row
  ("zigzag": device c's places hold chunks c and 2C - 1 - c, in that order); None for the
  contiguous layout (order = slots). `length` is a multiple of row_multiple's."""
  if layout != "zigzag" or context == 1:
    return None
  chunk = length // (2 * context)
  chunks = [c for device in range(context) for c in (device, 2 * context - 1 - device)]
  return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in chunks]).astype(np.int32)


def _chunks(x: jax.Array, order: np.ndarray, axis: int) -> tuple:
  """(x's token axis cut into its 2C zig-zag chunks: (..., 2C, T / 2C, ...), C)."""
  chunk = int(np.argmax(np.diff(order) != 1)) + 1  # order's first chunk ends where it jumps
  axis = axis % x.ndim
  return x.reshape(*x.shape[:axis], -1, chunk, *x.shape[axis + 1:]), x.shape[axis] // chunk // 2


def in_layout(x: jax.Array, order: np.ndarray | None, axis: int) -> jax.Array:
  """x with its token axis (`axis`) in the layout's order, x[..., order, ...] (x itself for
  contiguous): chunks 0..C-1 each followed by chunks 2C-1..C, by slicing and reversing (no
  gather, which would hold the whole axis on each device)."""
  if order is None:
    return x
  axis = axis % x.ndim
  chunks, context = _chunks(x, order, axis)
  first = jax.lax.slice_in_dim(chunks, 0, context, axis=axis)
  last = jnp.flip(jax.lax.slice_in_dim(chunks, context, 2 * context, axis=axis), axis)
  return jnp.stack([first, last], axis + 1).reshape(x.shape)


def from_layout(x: jax.Array, order: np.ndarray | None, axis: int) -> jax.Array:
  """The inverse of in_layout: x's token axis back in slot order."""
  if order is None:
    return x
  axis = axis % x.ndim
  chunks, context = _chunks(x, order, axis)
  pairs = chunks.reshape(*chunks.shape[:axis], context, 2, *chunks.shape[axis + 1:])
  first, last = (jax.lax.index_in_dim(pairs, i, axis + 1, keepdims=False) for i in (0, 1))
  return jnp.concatenate([first, jnp.flip(last, axis)], axis).reshape(x.shape)


def rows_layout(cfg) -> str:
  """The layout of a teacher-forced pass's split rows: model.context_layout, but contiguous
  for a mixture of experts, whose rows the decoder neither pads nor reorders (its routes are
  per token, in slot order)."""
  return "contiguous" if cfg.blocks.mixture else cfg.context_layout


def split_rows(cfg, tokens, kv_mask, positions):
  """A pass's rows made ready to split over the context devices: (tokens, kv_mask, positions)
  padded on the right to row_multiple's length (keys that no real query sees: they come after
  every real token and are masked), the pad, and the layout's order (layout_order)."""
  context = context_size()
  pad = -tokens.shape[1] % row_multiple(context, cfg.context_layout, cfg.attention_impl)
  tokens, kv_mask, positions = (pad_tokens(a, pad) for a in (tokens, kv_mask, positions))
  return tokens, kv_mask, positions, pad, layout_order(tokens.shape[1], context,
                                                       rows_layout(cfg))


def row_masks(kv_mask: jax.Array, num_queries: int, offset, window: int,
              order: np.ndarray | None) -> tuple:
  """(mask, window mask or None) of a pass's rows: attention_mask's and sliding_window_mask's
  (window > 0), or layout_mask's for rows in a layout's order (a teacher-forced pass, whose
  queries start at slot 0: offset is not read)."""
  if order is not None:
    return layout_mask(kv_mask, order), layout_mask(kv_mask, order, window) if window else None
  mask = attention_mask(kv_mask, num_queries, offset)
  return mask, sliding_window_mask(mask, num_queries, offset, window) if window else None


def layout_mask(kv_mask: jax.Array, order: np.ndarray, window: int = 0) -> jax.Array:
  """attention_mask(kv_mask, T, 0) (and sliding_window_mask's window, if > 0) with queries and
  keys both at the places of `order`: (B, T, T) bool, query place p sees key place r iff
  order[r] <= order[p], the key is real (kv_mask in slot order) and, with a window,
  order[p] - order[r] < window."""
  slots = jnp.asarray(order)  # (T,): compared in the program, not a (T, T) constant
  seen = slots[None, :] <= slots[:, None]
  if window:
    seen &= slots[:, None] - slots[None, :] < window
  return seen & jnp.take(kv_mask, slots, axis=1)[:, None, :].astype(bool)


def split_sequence_attention(q, k, v, mask, query_pre_attn_scalar: float = 0.0,
                             softcap: float = 0.0, block: int = SPLIT_QUERY_BLOCK):
  """grouped_query_attention(q, k, v, mask) with the rows' tokens split over the mesh's
  `context` axis:

      out[b, i] = softmax_j(cap(q_i k_j^T / sqrt(D)) + mask bias) v_j

  each device holding the queries of its own T/C tokens and every key and value: the keys and
  values are all-gathered over `context` (their layout asks for the whole sequence); the
  queries, scores, mask rows and outputs stay split, as (B, C, T/C, ...) with C over the
  devices. Each device takes its queries in blocks of `block`, one block after another
  (lax.map), each block's scores recomputed in the backward pass (jax.checkpoint): a pass
  holds one block's (block x T) scores per head at a time, not (T/C x T). The query heads are
  grouped by their kv head as a dimension of their own, never folded into the query axis (a
  fold would merge the split axis and gather it). Exact: each query's softmax runs over all
  of its keys on its own device. q (B, Tq, H, D) (Tq not a multiple of C: not split);
  k, v (B, Hkv, Tk, D); mask (B, Tq, Tk).
  Returns (B, Tq, H, D)."""
  batch, tq, heads, dim = q.shape
  kv_heads, keys = k.shape[1], k.shape[2]
  context = context_size()
  context = context if tq % context == 0 else 1
  local = tq // context
  q = constrain(q.reshape(batch, context, local, kv_heads, heads // kv_heads, dim),
                ("batch", "length", None, "kv_heads", None, None))
  mask = constrain(mask.reshape(batch, context, local, keys), ("batch", "length", None, None))
  k, v = (constrain(a, ("batch", "kv_heads", None, None)) for a in (k, v))
  scale = score_divisor(dim, query_pre_attn_scalar)

  @jax.checkpoint
  def attend(blocks):  # (B, C, b, Hkv, G, D), (B, C, b, Tk)
    q_block, mask_block = blocks
    scores = jnp.einsum("bcqhgd,bhkd->bchgqk", q_block, k, preferred_element_type=jnp.float32)
    scores = soft_cap(scores / scale, softcap)
    scores = jnp.where(mask_block[:, :, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bchgqk,bhkd->bcqhgd", probs, v)

  # One block after another (lax.map: a scan), so that a pass holds one block's scores.
  block = min(block, local)
  count = -(-local // block)
  pad = [(0, 0), (0, 0), (0, count * block - local)]
  in_blocks = lambda x: constrain(jnp.moveaxis(  # noqa: E731
      jnp.pad(x, pad + [(0, 0)] * (x.ndim - 3)).reshape(
          batch, context, count, block, *x.shape[3:]), 2, 0),
      (None, "batch", "length") + (None,) * (x.ndim - 2))
  out = jax.lax.map(attend, (in_blocks(q), in_blocks(mask)))  # (count, B, C, b, Hkv, G, D)
  out = jnp.moveaxis(out, 0, 2).reshape(batch, context, count * block, *out.shape[4:])
  out = out[:, :, :local]
  out = constrain(out, ("batch", "length", None, "kv_heads", None, None))
  return out.reshape(batch, tq, heads, dim)


def splash_fits(length: int) -> bool:
  """Whether tpu_splash_context_attention takes a row of `length` tokens on this mesh."""
  return length % row_multiple(context_size(), "contiguous", "pallas") == 0


@functools.lru_cache(maxsize=16)
def splash_kernel(length: int, context: int, group: int, layout: str, interpret: bool = False):
  """jax's splash attention kernel (multi-query form: `group` query heads per key head) for
  rows of `length` tokens whose queries are split over `context` devices in `layout`: a
  causal mask whose query i sits at slot order[i] (keys in slot order); its block lists are
  cut into `context` shards, one per device. interpret: Pallas's interpreter (any backend)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415
      splash_attention_kernel as splash, splash_attention_mask as masks)
  order = layout_order(length, context, layout)
  heads = []
  for _ in range(group):
    causal = masks.CausalMask((length, length), shard_count=context)
    if order is not None:  # the kernel reads each query's slot from q_sequence
      causal.q_sequence = order
    heads.append(causal)
  block = TPU_SPLASH_BLOCK
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            block_q_dq=block, block_kv_dq=block)
  build = functools.partial(splash.make_splash_mqa, masks.MultiHeadMask(heads),
                            block_sizes=sizes, head_shards=1, q_seq_shards=context,
                            interpret=interpret)
  # Built on a thread of its own, outside the caller's trace (jax's trace state is per thread),
  # as host arrays: the cached kernel outlives the trace.
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return jax.tree.map(np.asarray, pool.submit(build).result())


def tpu_splash_context_attention(q, k, v, mask, layout: str,
                                 query_pre_attn_scalar: float = 0.0, interpret: bool = False):
  """split_sequence_attention(q, k, v, mask) for a teacher-forced pass on TPU, by jax's Pallas
  splash attention kernel under jax.shard_map: each device's queries (its T/C places of the
  row, in `layout`'s order) against all of the row's keys, which the kernel takes in slot
  order (k and v gathered and put back in slot order). The mask goes in as the causal mask
  with each query's slot (the kernel skips key blocks that no query of a block sees) and
  segment ids: a key is real (1) or padding (0), read from the query at the last slot, which
  sees every key (tpu_flash_attention's argument). q (B, T, H, D), T a multiple of
  row_multiple(C, layout, "pallas"); k, v (B, Hkv, T, D); mask (B, T, T) (layout_mask's when
  zigzag). interpret: the kernel run by Pallas's interpreter (a check off the TPU).
  Returns (B, T, H, D)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415
      splash_attention_kernel as splash)
  batch, length, heads, dim = q.shape
  kv_heads = k.shape[1]
  group = heads // kv_heads
  context = context_size()
  order = layout_order(length, context, layout)
  last_place = length - 1 if order is None else int(np.argmax(order))
  real = mask[:, last_place].astype(jnp.int32)  # (B, T) per key place
  key_real, k, v = (from_layout(a, order, axis) for a, axis in ((real, 1), (k, 2), (v, 2)))
  q = q * jnp.asarray(1.0 / score_divisor(dim, query_pre_attn_scalar), q.dtype)
  q = q.reshape(batch, length, kv_heads, group, dim).transpose(0, 2, 3, 1, 4)  # (B,Hkv,G,T,D)
  kernel = splash_kernel(length, context, group, layout, interpret)
  mesh = jax.sharding.get_abstract_mesh()
  length_axes = LOGICAL_RULES["length"]
  kernel_spec = kernel.manual_sharding_spec(
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, length_axes)))
  q_spec = spec_for(("batch", "kv_heads", None, "length", None), q.shape, mesh)
  kv_spec = spec_for(("batch", "kv_heads", None, None), k.shape, mesh)
  real_spec = spec_for(("batch", "length"), real.shape, mesh)
  key_spec = spec_for(("batch", None), real.shape, mesh)

  @functools.partial(jax.shard_map, in_specs=(kernel_spec, q_spec, kv_spec, kv_spec, real_spec,
                                              key_spec),
                     out_specs=q_spec, check_vma=False)
  def attend(kernel, q, k, v, query_real, key_real):
    one_head = lambda q, k, v, segments: kernel(q, k, v, segment_ids=segments)  # noqa: E731
    per_row = jax.vmap(one_head, in_axes=(0, 0, 0, None))  # over the key heads
    return jax.vmap(per_row)(q, k, v, splash.SegmentIds(q=query_real, kv=key_real))

  out = attend(kernel, q, k, v, real, key_real)
  return out.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, dim).astype(v.dtype)
