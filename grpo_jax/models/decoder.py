"""A decoder-only transformer, in Flax Linen: grouped-query attention shared by every family;
the norms, the MLP, the embeddings' scale, the rotary function (RoPE in HF's rotate-half
layout; Qwen2.5-VL's mRoPE) and each layer's residual stream are the family's blocks
(`cfg.blocks`, models/families/; Llama's: RMSNorm, SwiGLU, pre-norm). The layers' params are
stacked on a leading layer axis (``layers/self_attn/q_proj/kernel`` is (L, embed, heads,
head_dim)) and run by one ``nn.scan`` (compile time independent of depth; MaxText's scanned
layers). Module names follow Hugging Face's (``embed_tokens``, ``self_attn/q_proj``, ...); its
per-layer names exist only at the checkpoint edge (models/hf.py). Every param declares its
logical axes where it is defined (`param_axes`); parallel/mesh.py's rules table maps them.

The KV cache is an explicit argument and an explicit output: ``apply`` is a pure function

    logits, cache = Decoder(cfg).apply({"params": p}, tokens, positions, kv_mask, cache, offset)

* ``tokens`` (B, T) int32; ``positions`` (B, T) int32, or (3, B, T) for mRoPE, read by the
  family's rotary function; ``prefix_embeddings`` (B, P', E) replaces the first P' positions'
  looked-up embeddings (a vision-language prompt's, models/prompt_inputs.py);
* without a cache (``cache=None``) the T tokens attend causally to each other, keys restricted
  to ``kv_mask`` (B, T) (False for padding);
* with a cache (a tuple of per-layer ``{"kt", "v"}`` arrays, models/kv_cache.py) the T tokens
  are written at slots ``[offset, offset + T)`` (``offset`` a scalar, or (B,)) and attend to
  every slot ``s <= their own`` with ``kv_mask[:, s]`` True; ``kv_mask`` is (B, S'),
  offset + T <= S' <= S, and only the first S' slots are read (a decode step skips the
  cache's empty tail);
* a shared-prompt cache (each layer also holds ``prompt_kt`` (B/G, kv_heads, head_dim, P) and
  ``prompt_v``: the G rows of a prompt read its keys once) takes ``kv_mask`` as the pair (the
  prompts' (B/G, P), the rows' own slots (B, S')); ``offset`` counts the rows' own slots.

The cache is head-major, the keys transposed (B, kv_heads, head_dim, S), the values
(B, kv_heads, S, head_dim): a decode step's two attention products read it as batched matrices
in the matmul kernels' layout, never transposing it. ``logits_window=(start, n)`` normalises
and projects only positions ``[start, start + n)`` (the prefill needs only the last position,
teacher-forced scoring only the completion's).
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models.attention import (attention_mask, bounded_attention,
                                       causal_blocked_attention, grouped_query_attention,
                                       library_attention, rotary_embedding,
                                       shared_prompt_attention, soft_cap)
from grpo_jax.models.blocks import normal_init, select_by, with_axes
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.context import (from_layout, in_layout, row_masks, rows_layout,
                                     splash_fits, split_rows, split_sequence_attention,
                                     tpu_splash_context_attention)
from grpo_jax.models.embeddings import embedding, lm_head, lookup, with_prefix
from grpo_jax.models.kv_cache import CACHE_SLOT_AXIS, Cache, write_cache
from grpo_jax.models.layout import per_layer, stack_layers
from grpo_jax.models.lora import LoraParams, adapted
from grpo_jax.models.moe import sown_routing
from grpo_jax.models.packing import pack_tokens, unpack_tokens
from grpo_jax.models.quantized import dequantized
from grpo_jax.parallel.mesh import constrain, context_size


# model.remat: what a layer keeps for its backward pass (MaxText's names); the rest is
# recomputed. "none" keeps every activation; "full" keeps only the layer's input; "save_dots"
# keeps the matmul outputs; "save_dots_no_batch" those without batch dimensions (weights-like).
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
    "save_dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

class Attention(nn.Module):
  """Self-attention; query_blocks: a teacher-forced pass, whose causal queries are taken in
  blocks (causal_blocked_attention); the sampler's cached passes are not."""
  cfg: ModelConfig
  query_blocks: bool = False

  @nn.compact
  def __call__(self, x, positions, mask, layer_cache, offset, adapters=None,
               token_index=None, sliding=None, read_limit=None):
    """adapters: this module's LoRA adapters ({"q_proj": {"lora_a", "lora_b"}, ...}) or None.
    read_limit: a cached pass reads only slots [0, read_limit) (bounded_attention; a traced
    scalar; None = every slot the mask covers). cfg.attention_impl other than "xla": the
    teacher-forced passes and the prefill call jax.nn.dot_product_attention (library_attention).
    token_index (C,): x is (1, C, embed), the packed tokens of the (B, T) rows that `mask`
    (B, T, S) describes (models/packing.py); the projections run on the C tokens, attention
    on the rows. sliding: whether this is a sliding-window layer (None: no layer is), which
    picks its RoPE base when cfg.rope_local_theta is set (the mask is the caller's)."""
    cfg = self.cfg
    lora = lambda y, x_, name: adapted(y, x_, adapters, name, cfg.lora_scale, cfg.dtype)  # noqa
    # Kernels keep the heads as a dimension, (embed, heads, head_dim) and o_proj's (heads,
    # head_dim, embed): the mesh rules (parallel/mesh.py) shard whole heads or none.
    heads = lambda n, axis, name: constrain(lora(nn.DenseGeneral(  # noqa: E731
        (n, cfg.head_dim), use_bias=cfg.qkv_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=with_axes(normal_init, "embed", axis, "head_dim"),
        bias_init=with_axes(nn.initializers.zeros_init(), axis, "head_dim"),
        name=name)(x), x, name), ("batch", "length", axis, None))
    q = heads(cfg.num_heads, "heads", "q_proj")
    k = heads(cfg.num_kv_heads, "kv_heads", "k_proj")
    v = heads(cfg.num_kv_heads, "kv_heads", "v_proj")
    if cfg.qk_norm:
      q = cfg.blocks.norm(cfg, "q_norm")(q)
      k = cfg.blocks.norm(cfg, "k_norm")(k)
    rope = lambda a: cfg.blocks.rotary(cfg, a, positions)  # noqa: E731
    if cfg.rope_local_theta and sliding is not None:  # Gemma 3: the local layers' own base
      local = lambda a: rotary_embedding(a, positions, cfg.rope_local_theta)  # noqa: E731
      rope = lambda a, g=rope: select_by(sliding, local(a), g(a))  # noqa: E731
    q, k = rope(q), rope(k)
    if token_index is not None:  # packed tokens -> their rows (zeros at the unused slots)
      q, k, v = (unpack_tokens(a, token_index, *mask.shape[:2]) for a in (q, k, v))
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # (B, Hkv, T, D)
    keys_transposed = layer_cache is not None and "kt" in layer_cache
    shared_prompt = layer_cache is not None and "prompt_kt" in layer_cache
    if shared_prompt:  # the prompts' keys held once (kv_cache.py); mask = (prompts', rows')
      prompt_mask, mask = mask
    fresh = (k, v, mask[..., :k.shape[2]]) if not shared_prompt else None  # a prefill's own keys
    if layer_cache is not None:
      filled = mask.shape[-1]  # read only the slots the mask covers (the filled ones)
      keys = "kt" if keys_transposed else "k"
      if keys_transposed:
        k = k.transpose(0, 1, 3, 2)  # (B, Hkv, D, T)
      layer_cache = {**layer_cache,
                     keys: write_cache(layer_cache[keys], k, offset, CACHE_SLOT_AXIS[keys]),
                     "v": write_cache(layer_cache["v"], v, offset)}
      k = jax.lax.slice_in_dim(layer_cache[keys], 0, filled, axis=CACHE_SLOT_AXIS[keys])
      v = layer_cache["v"][:, :, :filled]
      k, v = k.astype(cfg.dtype), v.astype(cfg.dtype)
    # The queries' first slot, where it is static: 0 without a cache (the tokens attend to each
    # other), the prompt's length for shared-prompt completions (an int), else unknown.
    first_slot = 0 if layer_cache is None else offset if isinstance(offset, int) else None
    scores = dict(query_pre_attn_scalar=cfg.query_pre_attn_scalar, softcap=cfg.attn_softcap)
    library = cfg.attention_impl != "xla" and not cfg.attn_softcap and not shared_prompt
    if cfg.attention_impl == "pallas":  # the TPU kernel: queries from slot 0, no window
      library = library and first_slot == 0 and not cfg.sliding_window
    # Context parallelism (models/context.py): the teacher-forced passes, and a prefill with a
    # fresh cache (the sampler's, under mesh.prefill_rules).
    split = context_size() > 1 and not shared_prompt and q.shape[1] > 1 and (
        layer_cache is None or (first_slot == 0 and keys_transposed))
    if split:
      own = (q, k, v, mask) if layer_cache is None else (q, *fresh)  # (a prefill: its own keys)
      if library and splash_fits(q.shape[1]):  # (a prefill's rows are in slot order)
        layout = rows_layout(cfg) if layer_cache is None else "contiguous"
        out = tpu_splash_context_attention(*own, layout, cfg.query_pre_attn_scalar)
      else:
        out = split_sequence_attention(*own, **scores)
    elif library and first_slot == 0 and keys_transposed and q.shape[1] > 1:  # the prefill
      out = library_attention(q, *fresh, cfg.attention_impl, cfg.query_pre_attn_scalar)
    elif library and not keys_transposed:  # the teacher-forced passes
      out = library_attention(q, k, v, mask, cfg.attention_impl, cfg.query_pre_attn_scalar)
    elif shared_prompt:
      out = shared_prompt_attention(q, layer_cache["prompt_kt"].astype(cfg.dtype),
                                    layer_cache["prompt_v"].astype(cfg.dtype), k, v,
                                    prompt_mask, mask, read_limit=read_limit, **scores)
    elif read_limit is not None and keys_transposed:
      out = bounded_attention(q, k, v, mask, read_limit, **scores)
    elif self.query_blocks and first_slot is not None and not keys_transposed:
      out = causal_blocked_attention(q, k, v, mask, first_slot, **scores)
    else:
      out = grouped_query_attention(q, k, v, mask, keys_transposed, **scores)
    out = constrain(out, ("batch", "length", "heads", None))
    if token_index is not None:
      out = pack_tokens(out, token_index)
    o_proj = nn.DenseGeneral(cfg.hidden_size, axis=(-2, -1), use_bias=False, dtype=cfg.dtype,
                             param_dtype=cfg.param_dtype,
                             kernel_init=with_axes(normal_init, "heads", "head_dim", "embed"),
                             name="o_proj")
    return lora(o_proj(out), out, "o_proj"), layer_cache


class DecoderLayer(nn.Module):
  """One layer: the family's residual stream (Blocks.layer; Llama's x + attn(norm(x)), then
  + mlp(norm(.))) around the shared attention and the family's MLP.

  group = G > 0 (shared-prompt scoring, models/scoring.shared_prompt_hidden): x, positions and
  mask are (prompt, completion) pairs and layer_cache is None. The B/G distinct prompts run
  first, writing their keys and values into a fresh per-layer cache; the cache is repeated G
  times and the B completion rows run against it at slot P (offset is unused). Both streams go
  through this layer's weights in one scan step, so the scan and its rematerialisation hold one
  stacked copy of the layer gradients, not one per pass. Returns ((prompt, completion), None).
  With token_index (C,) the completion stream is packed: (1, C, embed), the real tokens of the
  B rows of `mask` (models/packing.py); only attention sees the rows."""
  cfg: ModelConfig
  group: int = 0
  query_blocks: bool = False  # a teacher-forced pass (see Attention)

  @nn.compact
  def __call__(self, x, positions, mask, layer_cache, offset, adapters=None, token_index=None,
               window_mask=None, sliding=None, routes=None, read_limit=None):
    """window_mask: `mask` restricted to the sliding window (None: no layer has one); sliding:
    whether this layer uses it (a bool, or a traced scalar inside the layer scan); routes
    (B, T, k): routing replay, the experts of each token in this layer (models/moe.py)."""
    cfg = self.cfg
    adapters = adapters or {}
    attn = Attention(cfg, self.query_blocks, name="self_attn")
    mlp = cfg.blocks.mlp(cfg)
    block = cfg.blocks.layer(
        cfg, lambda h, positions, mask, layer_cache, offset, token_index=None: attn(
            h, positions, mask, layer_cache, offset, adapters.get("self_attn"), token_index,
            sliding, read_limit),
        lambda h: mlp(h, adapters.get("mlp"), routes))
    if window_mask is not None:
      mask = select_by(sliding, window_mask, mask)

    if not self.group:
      return block(x, positions, mask, layer_cache, offset)
    (prompt_x, completion_x), (prompt_pos, completion_pos), (prompt_mask, completion_mask) = (
        x, positions, mask)
    num_prompts, prompt_len = prompt_x.shape[:2]
    shape = (num_prompts, cfg.num_kv_heads, completion_mask.shape[-1], cfg.head_dim)
    cache = {"k": jnp.zeros(shape, cfg.dtype), "v": jnp.zeros(shape, cfg.dtype)}
    prompt_x, cache = block(prompt_x, prompt_pos, prompt_mask, cache, 0)
    cache = jax.tree.map(lambda c: jnp.repeat(c, self.group, axis=0), cache)
    completion_x, _ = block(completion_x, completion_pos, completion_mask, cache, prompt_len,
                            token_index)
    return (prompt_x, completion_x), None


class Decoder(nn.Module):
  """Token ids -> next-token logits (float32). See the module docstring for the cache API."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens, positions, kv_mask, cache: Optional[Cache] = None, offset=0,
               return_hidden: bool = False, logits_window: Optional[tuple] = None,
               project: bool = True, adapters=None, prompt_group: int = 0, token_index=None,
               routes=None, read_limit=None, prefix_embeddings=None):
    """project=False returns (normed hidden states of the window, cache) without the
    vocabulary projection (chunked scoring projects them itself, grpo_jax/models/scoring.py).
    adapters: LoRA adapters (grpo_jax/models/lora.py) added to the projections, or None.
    The layers are rematerialised by model.remat in the passes without a cache (the
    differentiated ones; the sampler's passes with a cache are not).
    prompt_group = G > 0: shared-prompt scoring (models/scoring.shared_prompt_hidden). tokens,
    positions and kv_mask are (prompt, completion) pairs: (B/G, P) distinct prompts and (B, T)
    completion inputs, kv_mask (B/G, P) and (B, P + T); cache is None. Returns (the normed
    hidden states (B, 1 + T, H): each prompt's last position repeated G times, then the
    completion's, None); see DecoderLayer. With token_index (C,) (models/packing.py) the
    completion inputs are packed, tokens[1] and positions[1] (1, C), and so is the result:
    ((B, 1, H) the prompts' last positions, (1, C, H) the packed tokens'), None.
    routes (B, T, L, k) int32: routing replay (a mixture of experts, models/moe.py), each
    token's experts in each layer, used instead of the router's own top-k; the passes without
    prompt_group or packing take it. Applied with mutable=["intermediates"], the experts' choices
    come back too (moe.sown_routing). read_limit (a pass with a cache): only cache slots
    [0, read_limit) are read, in blocks (attention.bounded_attention; a traced scalar).
    prefix_embeddings: see the module docstring; with prompt_group, the prompts'."""
    cfg = self.cfg
    embed = embedding(cfg)
    scale = cfg.blocks.embed_scale(cfg)
    scale = None if scale is None else jnp.asarray(scale, cfg.dtype)
    # activations: rows over data x fsdp
    embedded = lambda t: constrain(  # noqa: E731
        lookup(embed, t, cfg.dtype) if scale is None else lookup(embed, t, cfg.dtype) * scale,
        ("batch", "length", None))
    window = cfg.sliding_window
    window_mask = None
    pad, order = 0, None
    if prompt_group:
      prompt_len = tokens[0].shape[1]
      x = tuple(embedded(t) for t in tokens)
      num_new = kv_mask[1].shape[1] - prompt_len
      mask, window_mask = zip(row_masks(kv_mask[0], prompt_len, 0, window, None),
                              row_masks(kv_mask[1], num_new, prompt_len, window, None))
      window_mask = window_mask if window else None
    elif isinstance(kv_mask, tuple):  # a shared-prompt cache: (the prompts', the rows' own)
      if window:
        raise ValueError("a sliding-window model cannot read a shared-prompt cache (the "
                         "prompt's slots would need a per-query window); decode without one.")
      x = embedded(tokens)
      mask = (kv_mask[0].astype(bool), attention_mask(kv_mask[1], tokens.shape[1], offset))
    else:
      if cache is None and not cfg.blocks.mixture and context_size() > 1:  # models/context.py
        tokens, kv_mask, positions, pad, order = split_rows(cfg, tokens, kv_mask, positions)
      x = embedded(tokens)
      mask, window_mask = row_masks(kv_mask, tokens.shape[1], offset, window, order)
    if prefix_embeddings is not None:
      x = (with_prefix(x[0], prefix_embeddings), x[1]) if prompt_group else with_prefix(
          x, prefix_embeddings)
    if order is not None:
      x = constrain(in_layout(x, order, 1), ("batch", "length", None))
      positions = in_layout(positions, order, -1)
    sliding = cfg.sliding_layers()
    if cache is not None:
      # Forwards with a KV cache (prefill, decode) run the layers one by one, each on its slice of
      # the stack with its quantised kernels (rollout.weight_dtype, models/quantized.py) dequantised
      # just before it runs, and keep one cache per layer: a decode loop's scan would copy a stacked
      # (layers, ...) cache whole every step (the sampler ran 1.6x slower at 512 new tokens).
      layer_params = per_layer(self.variables["params"]["layers"], cfg.num_layers)
      layer_adapters = (None if adapters is None else
                        per_layer(adapters["layers"], cfg.num_layers))
      new_cache = []
      # A mixture's routing choices, sown by each layer's own apply, are sown again here.
      record = cfg.blocks.mixture and self.is_mutable_collection("intermediates")
      for i in range(cfg.num_layers):
        layer, x = dequantized(layer_params[i], cfg.dtype, x)
        out = DecoderLayer(cfg, prompt_group).apply(
            {"params": layer}, x, positions, mask, cache[i], offset,
            None if layer_adapters is None else layer_adapters[i], None, window_mask,
            sliding[i] if window else None, None if routes is None else routes[:, :, i],
            read_limit, mutable=["intermediates"] if record else False)
        (x, layer_cache), sown = out if record else (out, None)
        if record:
          for name, value in sown["intermediates"]["mlp"].items():
            self.sow("intermediates", name, value[0])
        new_cache.append(layer_cache)
      new_cache = tuple(new_cache)
    else:  # one nn.scan over the stacked layers, rematerialised by model.remat
      layer_cls = DecoderLayer
      if REMAT_POLICIES[cfg.remat] is not None:
        layer_cls = nn.remat(DecoderLayer, policy=REMAT_POLICIES[cfg.remat], prevent_cse=False)
      scanned = nn.scan(layer_cls, variable_axes={"params": 0, "intermediates": 0},
                        split_rngs={"params": True},
                        in_axes=(nn.broadcast, nn.broadcast, 0, nn.broadcast, 0,
                                 nn.broadcast, nn.broadcast, 0, 0),
                        length=cfg.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      layer_adapters = None if adapters is None else adapters["layers"]
      x, new_cache = scanned(cfg, prompt_group, True, name="layers")(
          x, positions, mask, cache, offset, layer_adapters, token_index, window_mask,
          jnp.asarray(sliding) if window else None,
          None if routes is None else jnp.moveaxis(routes, 2, 0))
    if prompt_group:
      norm = cfg.blocks.norm(cfg, "norm")
      last = jnp.repeat(norm(x[0][:, -1:]), prompt_group, axis=0)
      if token_index is not None:
        return (last, norm(x[1])), None
      return jnp.concatenate([last, norm(x[1])], axis=1), None
    x = from_layout(x, order, 1)
    if pad:
      x = x[:, :-pad]
    if logits_window is not None:
      start, length = logits_window
      x = x[:, start:start + length]
    x = cfg.blocks.norm(cfg, "norm")(x)
    if not project:
      return x, new_cache
    logits = embed.attend(x) if cfg.tie_embeddings else lm_head(cfg)(x)
    logits = soft_cap(logits.astype(jnp.float32), cfg.final_softcap)
    if return_hidden:
      return logits, new_cache, x
    return logits, new_cache


def decoder_apply(model_cfg: ModelConfig, params, *args, record_routing: bool = False,
                  **kwargs):
  """Decoder(model_cfg).apply on plain params, or on LoraParams (the base's weights with the
  adapters added to the projections): the one entry point of every forward pass.
  record_routing (a mixture of experts): returns (the output, `sown_routing` of the pass)."""
  if isinstance(params, LoraParams):
    variables, kwargs = {"params": params.base}, {**kwargs, "adapters": params.adapters}
  else:
    variables = {"params": params}
  if not record_routing:
    return Decoder(model_cfg).apply(variables, *args, **kwargs)
  out, sown = Decoder(model_cfg).apply(variables, *args, mutable=["intermediates"], **kwargs)
  return out, sown_routing(sown.get("intermediates", {}), model_cfg, args[0].shape)


class _OneModulePerLayer(nn.Module):
  """The params with one module per layer (layers_0, ...): init_params draws through this and
  stacks them (flax keys each param by its module path: these paths fix what a seed gives)."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens, positions, kv_mask):
    cfg = self.cfg
    x = embedding(cfg)(tokens)
    mask = attention_mask(kv_mask, tokens.shape[1], 0)
    for i in range(cfg.num_layers):
      x, _ = DecoderLayer(cfg, name=f"layers_{i}")(x, positions, mask, None, 0)
    x = cfg.blocks.norm(cfg, "norm")(x)
    return x if cfg.tie_embeddings else lm_head(cfg)(x)


def _dummy_inputs():
  return jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2), bool)


def init_params(cfg: ModelConfig, key: jax.Array):
  """Random params (a plain nested dict of arrays, the layers stacked on a leading axis)."""
  per_layer = nn.unbox(_OneModulePerLayer(cfg).init(key, *_dummy_inputs())["params"])
  return stack_layers(per_layer, cfg.num_layers)


def param_axes(cfg: ModelConfig):
  """The params' logical axis names, as declared where each param is defined: a tree shaped
  like `init_params(cfg, key)` of tuples ("layers", "embed", "heads", "head_dim"), ...)."""
  boxed = jax.eval_shape(lambda key: Decoder(cfg).init(key, *_dummy_inputs())["params"],
                         jax.random.key(0))
  return jax.tree.map(lambda b: tuple(b.names), boxed,
                      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """Rotary positions for a left-padded row: 0, 1, ... over the real tokens (pads get 0)."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)
