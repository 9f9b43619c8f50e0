"""The decoder's attention arithmetic as pure functions: rotary position embeddings, grouped-query
attention on batched matmuls, its causal query blocks for the teacher-forced passes, and the
causal and sliding-window masks on cache slots (models/decoder.py's Attention module calls
them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def rotary_embedding(x: jax.Array, positions: jax.Array, theta: float,
                     inv_freq: np.ndarray | None = None,
                     attention_factor: float = 1.0) -> jax.Array:
  """Applies RoPE in HF's rotate-half layout.

  With inv_freq_i = theta^(-2i/D) (or the given inverse frequencies of a scaled rope type,
  models/rope.py), angle = position * inv_freq, cos/sin tiled twice over D and scaled by the
  attention factor (YaRN's; 1 otherwise):
      rope(x) = x * cos + rotate_half(x) * sin,  rotate_half([x1, x2]) = [-x2, x1].
  x: (B, T, H, D); positions: (B, T).
  """
  head_dim = x.shape[-1]
  if inv_freq is None:
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, T, D/2)
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # (B, T, 1, D)
  return apply_rotation(x, jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor)


def apply_rotation(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1] over x's last axis, with
  cos and sin broadcast against x, computed in float32 and cast back to x's dtype (RoPE, the
  text side's mRoPE and the vision encoder's 2-D RoPE)."""
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  return (x32 * cos + jnp.concatenate([-x2, x1], axis=-1) * sin).astype(x.dtype)


def soft_cap(x: jax.Array, cap: float) -> jax.Array:
  """cap * tanh(x / cap) (Gemma 2's attention and final logit soft-capping); x when cap is 0."""
  return x if not cap else jnp.tanh(x / cap) * cap


def score_divisor(dim: int, query_pre_attn_scalar: float = 0.0):
  """What the scores are divided by: sqrt(head_dim), or sqrt(query_pre_attn_scalar) (Gemma)."""
  return jnp.sqrt(jnp.float32(query_pre_attn_scalar or dim))


def _fold_query_heads(q: jax.Array, kv_heads: int) -> jax.Array:
  """(B, Tq, H, D) -> (B, Hkv, G x Tq, D): a kv head's G = H / Hkv query heads and the Tq
  queries as one row axis, rows (g, t)."""
  batch, tq, heads, dim = q.shape
  q = q.reshape(batch, tq, kv_heads, heads // kv_heads, dim).transpose(0, 2, 3, 1, 4)
  return q.reshape(batch, kv_heads, heads // kv_heads * tq, dim)


def _unfold_query_heads(out: jax.Array, tq: int) -> jax.Array:
  """The inverse of _fold_query_heads: (B, Hkv, G x Tq, D) -> (B, Tq, H, D)."""
  batch, kv_heads, rows, dim = out.shape
  out = out.reshape(batch, kv_heads, rows // tq, tq, dim).transpose(0, 3, 1, 2, 4)
  return out.reshape(batch, tq, kv_heads * (rows // tq), dim)


def grouped_query_attention(q, k, v, mask, keys_transposed: bool = False,
                            query_pre_attn_scalar: float = 0.0, softcap: float = 0.0):
  """softmax(cap(q k^T / sqrt(D)) + mask) v with kv heads shared by groups of query heads
  (D: query_pre_attn_scalar when given; cap: soft_cap with `softcap`).

  q: (B, Tq, H, D); k, v: (B, Hkv, Tk, D) (head-major), or with keys_transposed k is
  (B, Hkv, D, Tk) (the sampler's cache layout); mask: (B, Tq, Tk) bool (True = may attend).
  Scores and softmax are float32. Returns (B, Tq, H, D).
  Both products are plain batched matmuls over (B, Hkv), a group's G = H / Hkv query heads and
  the Tq queries folded into one row axis: XLA:CPU runs that form in its fast matmul kernels
  (5-d einsums run as generic dots, several times slower per decode step).
  """
  batch, tq, heads, dim = q.shape
  kv_heads = k.shape[1]
  group = heads // kv_heads
  q = _fold_query_heads(q, kv_heads)
  scores = jnp.einsum("bhqd,bhdk->bhqk" if keys_transposed else "bhqd,bhkd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  scores = soft_cap(scores / score_divisor(dim, query_pre_attn_scalar), softcap)
  scores = scores.reshape(batch, kv_heads, group, tq, -1)
  scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bhqk,bhkd->bhqd", probs.reshape(batch, kv_heads, group * tq, -1), v)
  return _unfold_query_heads(out, tq)


# The sampler's decode steps read the cache in blocks of this many slots up to a traced bound
# (bounded_attention): one compiled loop whatever the bound.
READ_BLOCK = 128


def _online_blocks(q, kt, v, mask, read_limit, block, scale, softcap, init):
  """The online softmax of bounded_attention over the cache's blocks below read_limit, from
  the state `init` = (top, total, acc): q folded (B, Hkv, G x Tq, D); returns the state."""
  batch, kv_heads, rows, _ = q.shape
  slots, tq = kt.shape[3], mask.shape[1]
  block = min(block, slots)
  minimum = jnp.finfo(jnp.float32).min

  def step(j, carry):
    top, total, acc = carry
    start = jnp.minimum(j * block, slots - block)
    keys = jax.lax.dynamic_slice_in_dim(kt, start, block, axis=3)
    values = jax.lax.dynamic_slice_in_dim(v, start, block, axis=2)
    seen = jax.lax.dynamic_slice_in_dim(mask, start, block, axis=2)
    seen = seen & (start + jnp.arange(block) >= j * block)  # a clamped block: new slots only
    s = soft_cap(jnp.einsum("bhqd,bhdk->bhqk", q, keys, preferred_element_type=jnp.float32)
                 * scale, softcap)
    s = jnp.where(seen[:, None, None], s.reshape(batch, kv_heads, rows // tq, tq, block),
                  minimum).reshape(batch, kv_heads, rows, block)
    new_top = jnp.maximum(top, jnp.max(s, axis=-1, keepdims=True))
    weights = jnp.exp(s - new_top)
    decay = jnp.exp(top - new_top)
    acc = acc * decay + jnp.einsum("bhqk,bhkd->bhqd", weights.astype(v.dtype), values,
                                   preferred_element_type=jnp.float32)
    return new_top, total * decay + jnp.sum(weights, axis=-1, keepdims=True), acc

  blocks = (jnp.asarray(read_limit, jnp.int32) + block - 1) // block
  return jax.lax.fori_loop(0, jnp.clip(blocks, 1, -(-slots // block)), step, init)


def bounded_attention(q, kt, v, mask, read_limit, block: int | None = None,
                      query_pre_attn_scalar: float = 0.0, softcap: float = 0.0):
  """grouped_query_attention(q, kt, v, mask, keys_transposed=True) that reads only the cache
  slots [0, read_limit), in blocks of `block` slots, with the softmax taken online:

      for j < ceil(read_limit / block), over the block's slots (masked scores at min):
          s_j = cap(q kt_j / sqrt(D)) + mask bias,   m_j = max(m_{j-1}, max s_j)
          l_j = l_{j-1} exp(m_{j-1} - m_j) + sum exp(s_j - m_j)
          a_j = a_{j-1} exp(m_{j-1} - m_j) + exp(s_j - m_j) v_j
      out = a / l.

  read_limit is a traced int32 scalar, so one compiled loop serves every bound: the slot-refill
  engine passes its busy slots' furthest filled slot + 1 (rows at different positions of a
  cache of P + N slots). Every slot >= read_limit must be masked for every query (such slots
  are never read). A last block that would run past the cache starts at S - block and skips
  the slots an earlier block read. On the CPU a block is copied out of the cache before its
  products (XLA:CPU has no dynamic-slice operands), so a bounded read pays only where it
  reads well under the whole cache.
  q (B, Tq, H, D); kt (B, Hkv, D, S); v (B, Hkv, S, D); mask (B, Tq, S) bool. Returns
  (B, Tq, H, D); equal to grouped_query_attention up to the order of float32 sums."""
  batch, tq, heads, dim = q.shape
  kv_heads = kt.shape[1]
  rows = (batch, kv_heads, heads // kv_heads * tq)
  init = (jnp.full((*rows, 1), jnp.finfo(jnp.float32).min, jnp.float32),
          jnp.zeros((*rows, 1), jnp.float32), jnp.zeros((*rows, dim), jnp.float32))
  _, total, acc = _online_blocks(_fold_query_heads(q, kv_heads), kt, v, mask, read_limit,
                                 block or READ_BLOCK, 1.0 / score_divisor(dim, query_pre_attn_scalar),
                                 softcap, init)
  return _unfold_query_heads((acc / total).astype(v.dtype), tq)


def library_attention(q, k, v, mask, implementation: str,
                      query_pre_attn_scalar: float = 0.0):
  """grouped_query_attention(q, k, v, mask) by a library kernel (model.attention_impl):
  "jax": jax.nn.dot_product_attention's XLA form; "cudnn": its cuDNN fused kernel (GPU only,
  bfloat16 or float16); "pallas": the Pallas TPU flash attention kernel that jax ships
  (tpu_flash_attention). softmax(q k^T / sqrt(D) + mask bias) v, D = query_pre_attn_scalar or
  head_dim. No soft-capping (the caller keeps ours for a model with one). q (B, Tq, H, D);
  k, v (B, Hkv, Tk, D); mask (B, Tq, Tk) bool. Returns (B, Tq, H, D)."""
  if implementation == "pallas":
    return tpu_flash_attention(q, k, v, mask, query_pre_attn_scalar)
  dim = q.shape[-1]
  out = jax.nn.dot_product_attention(
      q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask=mask[:, None],
      scale=float(1.0 / np.sqrt(query_pre_attn_scalar or dim)),
      implementation="xla" if implementation == "jax" else implementation)
  return out.astype(v.dtype)


# The Pallas TPU flash kernel's blocks: its key blocks must be multiples of 128 tokens.
TPU_FLASH_BLOCK = 128


def tpu_flash_attention(q, k, v, mask, query_pre_attn_scalar: float = 0.0):
  """grouped_query_attention(q, k, v, mask) for a causal pass whose queries are its keys (a
  teacher-forced pass, a prefill's own tokens), by jax's Pallas TPU flash attention kernel
  (jax.experimental.pallas.ops.tpu.flash_attention; a TPU only, its own backward pass).

  The kernel takes no mask, so the mask is given as its causal flag and segment ids: a key
  is real (segment 1) or padding (segment 0), read from the mask's last query row, which sees
  every key of the row (mask[b, T-1, j] = kv_mask[b, j]). A real query then sees key j iff
  j <= i and j is real, which is the mask; a padding query sees other padding only (its output
  is never read). The rows are padded to a multiple of 128 tokens (segment 0) for the kernel's
  blocks, and the kv heads repeated for their query heads. q (B, T, H, D); k, v (B, Hkv, T, D);
  mask (B, T, T) causal. Returns (B, T, H, D)."""
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash  # noqa: PLC0415
  batch, length, heads, dim = q.shape
  group = heads // k.shape[1]
  segments = mask[:, -1].astype(jnp.int32)
  pad = -length % TPU_FLASH_BLOCK
  grow = lambda a, axis: jnp.pad(a, [(0, pad if i == axis else 0)  # noqa: E731
                                     for i in range(a.ndim)])
  q, k, v = (grow(a, 2) for a in (q.transpose(0, 2, 1, 3), jnp.repeat(k, group, axis=1),
                                   jnp.repeat(v, group, axis=1)))
  segments = grow(segments, 1)
  block = TPU_FLASH_BLOCK
  sizes = tpu_flash.BlockSizes(
      block_q=block, block_k_major=block, block_k=block, block_b=1, block_q_major_dkv=block,
      block_k_major_dkv=block, block_k_dkv=block, block_q_dkv=block, block_k_major_dq=block,
      block_k_dq=block, block_q_dq=block)
  out = tpu_flash.flash_attention(
      q, k, v, segment_ids=tpu_flash.SegmentIds(q=segments, kv=segments), causal=True,
      sm_scale=float(1.0 / np.sqrt(query_pre_attn_scalar or dim)), block_sizes=sizes)
  return out[:, :, :length].transpose(0, 2, 1, 3).astype(v.dtype)


def _rows_of_prompts(x: jax.Array, group: int) -> jax.Array:
  """(B/G, Hkv, G * R, ...) -> (B, Hkv, R, ...): a prompt's G rows stacked in its row axis
  back to one row each (groups contiguous)."""
  prompts, kv_heads, stacked = x.shape[:3]
  x = x.reshape(prompts, kv_heads, group, stacked // group, *x.shape[3:]).swapaxes(1, 2)
  return x.reshape(prompts * group, kv_heads, stacked // group, *x.shape[4:])


def _prompts_of_rows(x: jax.Array, group: int) -> jax.Array:
  """The inverse of _rows_of_prompts: (B, Hkv, R, ...) -> (B/G, Hkv, G * R, ...)."""
  batch, kv_heads, rows = x.shape[:3]
  x = x.reshape(batch // group, group, kv_heads, rows, *x.shape[3:]).swapaxes(1, 2)
  return x.reshape(batch // group, kv_heads, group * rows, *x.shape[4:])


def shared_prompt_attention(q, prompt_kt, prompt_v, kt, v, prompt_mask, mask,
                            query_pre_attn_scalar: float = 0.0, softcap: float = 0.0,
                            read_limit=None):
  """grouped_query_attention for B = prompts x G rows (groups contiguous) whose keys are their
  prompt's P slots and then their own S slots, with each prompt's keys and values held once:

      out = (exp(s_p - m) v_p + exp(s_c - m) v_c) / (sum exp(s_p - m) + sum exp(s_c - m)),
      s = cap(q k^T / sqrt(D)) + mask bias,  m = max(max s_p, max s_c)  per row, head and
      query (as grouped_query_attention's),

  the prompt products taken for the G rows of a prompt together, (B/G, Hkv, G x group x Tq, D)
  against (B/G, Hkv, D, P): a decode step reads the prompt's cache once, not G times.
  q (B, Tq, H, D); prompt_kt (B/G, Hkv, D, P) and prompt_v (B/G, Hkv, P, D); kt (B, Hkv, D, S)
  and v (B, Hkv, S, D) the rows' own slots (the sampler's cache layout); prompt_mask (B/G, P),
  mask (B, Tq, S) bool. Returns (B, Tq, H, D). read_limit (a traced scalar): the rows' own
  slots are read only below it, in blocks, continuing the prompt part's online softmax
  (bounded_attention)."""
  batch, tq, heads, dim = q.shape
  prompts, kv_heads = prompt_kt.shape[:2]
  group, per_kv = batch // prompts, heads // kv_heads
  minimum, scale = jnp.finfo(jnp.float32).min, 1.0 / score_divisor(dim, query_pre_attn_scalar)
  q = _fold_query_heads(q, kv_heads)
  shared = soft_cap(jnp.einsum("bhqd,bhdk->bhqk", _prompts_of_rows(q, group), prompt_kt,
                               preferred_element_type=jnp.float32) * scale, softcap)
  shared = shared + jnp.where(prompt_mask, 0.0, minimum)[:, None, None]
  if read_limit is not None:
    top = jnp.max(shared, axis=-1, keepdims=True)
    weights = jnp.exp(shared - top)
    init = (_rows_of_prompts(top, group),
            _rows_of_prompts(jnp.sum(weights, axis=-1, keepdims=True), group),
            _rows_of_prompts(jnp.einsum("bhqk,bhkd->bhqd", weights.astype(v.dtype), prompt_v,
                                        preferred_element_type=jnp.float32), group))
    _, total, acc = _online_blocks(q, kt, v, mask, read_limit, READ_BLOCK, scale, softcap,
                                   init)
    return _unfold_query_heads((acc / total).astype(v.dtype), tq)
  own = soft_cap(jnp.einsum("bhqd,bhdk->bhqk", q, kt, preferred_element_type=jnp.float32)
                 * scale, softcap)
  own = (own.reshape(batch, kv_heads, per_kv, tq, -1)
         + jnp.where(mask, 0.0, minimum)[:, None, None]).reshape(batch, kv_heads, per_kv * tq, -1)
  top = jax.lax.stop_gradient(jnp.maximum(
      _rows_of_prompts(jnp.max(shared, axis=-1, keepdims=True), group),
      jnp.max(own, axis=-1, keepdims=True)))  # (B, Hkv, rows, 1)
  shared_w = jnp.exp(shared - _prompts_of_rows(top, group))
  own_w = jnp.exp(own - top)
  total = (_rows_of_prompts(jnp.sum(shared_w, axis=-1, keepdims=True), group)
           + jnp.sum(own_w, axis=-1, keepdims=True))
  out = (_rows_of_prompts(jnp.einsum("bhqk,bhkd->bhqd", shared_w.astype(v.dtype), prompt_v,
                                     preferred_element_type=jnp.float32), group)
         + jnp.einsum("bhqk,bhkd->bhqd", own_w.astype(v.dtype), v,
                      preferred_element_type=jnp.float32)) / total
  return _unfold_query_heads(out.astype(v.dtype), tq)


# Teacher-forced passes (no cache) take their queries in blocks of this many, each block against
# the keys up to its last query's slot only (causal_blocked_attention).
QUERY_BLOCK = 128


def causal_blocked_attention(q, k, v, mask, offset: int, block: int = QUERY_BLOCK, **scores):
  """grouped_query_attention(q, k, v, mask) for queries at slots offset, offset + 1, ... under
  a causal mask (a query sees no slot past its own): the queries in blocks of `block`, each
  against keys [0, offset + its block's end) only. The keys left out are masked for every
  query of the block, weight exp(min - max) = 0 in the softmax, so the values are the same up
  to the order of float32 sums; on a 512-token completion after a 192-token prompt about a
  quarter of the score and softmax work is not done. k, v: (B, Hkv, Tk, D); `scores`:
  grouped_query_attention's query_pre_attn_scalar and softcap."""
  num_queries, num_keys = q.shape[1], k.shape[2]
  if num_queries <= block:
    return grouped_query_attention(q, k, v, mask, **scores)
  outs = []
  for start in range(0, num_queries, block):
    stop = min(start + block, num_queries)
    keys = min(num_keys, offset + stop)
    outs.append(grouped_query_attention(q[:, start:stop], k[:, :, :keys], v[:, :, :keys],
                                        mask[:, start:stop, :keys], **scores))
  return jnp.concatenate(outs, axis=1)


def attention_mask(kv_mask: jax.Array, num_queries: int, offset) -> jax.Array:
  """(B, Tq, S) bool: query i of row b (at slot offset + i, offset a scalar or (B,)) may see
  key slot s iff s <= offset + i and kv_mask[b, s]."""
  num_keys = kv_mask.shape[1]
  query_slots = jnp.reshape(offset, (-1, 1)) + jnp.arange(num_queries)  # (1 or B, Tq)
  causal = jnp.arange(num_keys) <= query_slots[:, :, None]
  return causal & kv_mask[:, None, :].astype(bool)


def sliding_window_mask(mask: jax.Array, num_queries: int, offset, window: int) -> jax.Array:
  """attention_mask's (B, Tq, S) `mask` restricted to the window: query i (at slot offset + i)
  sees key slot s only if offset + i - s < window (transformers' sliding_window_overlay, on
  cache slots)."""
  query_slots = jnp.reshape(offset, (-1, 1)) + jnp.arange(num_queries)  # (1 or B, Tq)
  return mask & (query_slots[:, :, None] - jnp.arange(mask.shape[-1]) < window)
