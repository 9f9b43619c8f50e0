"""Mixture-of-experts MLPs (Qwen3-MoE, as transformers 5 defines Qwen3MoeSparseMoeBlock): a
router picks each token's top-k experts, each a SwiGLU MLP, computed as grouped matmuls
(`jax.lax.ragged_dot`: the token-expert assignments sorted by expert, one matmul per
projection over all experts' groups, no per-expert loop and no dense all-experts compute).

    p = softmax(x W_router)                  (float32)
    (w, e) = top_k(p);  w <- w / sum(w)      (when norm_topk_prob)
    y = sum_j w_j * down_e_j(silu(gate_e_j(x)) * up_e_j(x))

Params (stacked over layers like every other): mlp/gate/kernel (embed, expert) and
mlp/experts/{gate_proj, up_proj}/kernel (expert, embed, mlp), mlp/experts/down_proj/kernel
(expert, mlp, embed); Hugging Face's per-expert tensors (model.layers.N.mlp.experts.E.gate_proj
.weight, ...) exist only at the checkpoint edge (models/hf_names.py). `load_balancing_loss` is
transformers' auxiliary loss (load_balancing_loss_func). The family (its blocks, config.json):
models/families/qwen3_moe.py.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models.blocks import normal_init, with_axes

def route(logits: jax.Array, top_k: int, normalise: bool, replayed=None):
  """(weights (N, k) float32, experts (N, k) int32) of router logits (N, E): the top-k experts
  by softmax probability, or `replayed` (N, k) experts (routing replay: the experts another
  pass chose, weighted by this pass's probabilities of them, so the router is still trained)."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  if replayed is None:
    weights, experts = jax.lax.top_k(probs, top_k)
  else:
    experts = replayed
    weights = jnp.take_along_axis(probs, experts, axis=-1)
  if normalise:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return weights, experts.astype(jnp.int32)


def routes_differ(a: jax.Array, b: jax.Array) -> jax.Array:
  """(...) bool: whether two routings (..., k) chose different sets of experts (the order
  within a token's k choices does not count)."""
  return jnp.any(jnp.sort(a, axis=-1) != jnp.sort(b, axis=-1), axis=-1)


def grouped_expert_mlp(x, experts, weights, gate, up, down, num_experts: int):
  """sum_j weights[:, j] * down_e(silu(gate_e(x)) * up_e(x)) at e = experts[:, j], by
  ragged_dot over the (N x k) assignments sorted by expert. x (N, H); experts, weights (N, k);
  gate, up (E, H, I); down (E, I, H). Returns (N, H) in x's dtype."""
  n, k = experts.shape
  flat = experts.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  token = order // k  # the token of each sorted assignment
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  xs = x[token]
  hidden = (nn.silu(jax.lax.ragged_dot(xs, gate, sizes)) * jax.lax.ragged_dot(xs, up, sizes))
  out = jax.lax.ragged_dot(hidden, down, sizes).astype(jnp.float32)
  out = out * weights.reshape(-1)[order][:, None]
  return jnp.zeros((n, x.shape[-1]), jnp.float32).at[token].add(out).astype(x.dtype)


class _Kernel(nn.Module):
  """One stacked expert projection's kernel (E, in, out) (a module, so that its path names the
  projection like a Dense's: experts/gate_proj/kernel)."""
  shape: tuple
  axes: tuple
  param_dtype: object

  @nn.compact
  def __call__(self):
    return self.param("kernel", with_axes(normal_init, *self.axes), self.shape,
                      self.param_dtype)


class MoE(nn.Module):
  """The sparse MLP block (module docstring); x (..., H) -> (..., H).

  It sows, in the "intermediates" collection, what it routed: "routes" (N, k) int32, the top-k
  experts its router chose for the N = prod(x.shape[:-1]) tokens (the sampler records them,
  rollout/static.py), and "router_logits" (N, E) float32 (the load-balancing loss reads them).
  replayed (..., k) int32: routing replay, the experts to use instead of its own choice."""
  cfg: object  # ModelConfig

  @nn.compact
  def __call__(self, x, replayed=None):
    cfg = self.cfg
    e, hidden, inner = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    flat = x.reshape(-1, hidden)
    logits = nn.Dense(e, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      kernel_init=with_axes(normal_init, "embed", "expert"),
                      name="gate")(flat)
    k = cfg.experts_per_token
    own = route(logits, k, cfg.norm_topk_prob)
    self.sow("intermediates", "routes", own[1])
    self.sow("intermediates", "router_logits", logits.astype(jnp.float32))
    weights, chosen = (own if replayed is None else
                       route(logits, k, cfg.norm_topk_prob, replayed.reshape(-1, k)))

    class Experts(nn.Module):
      @nn.compact
      def __call__(self):
        make = lambda shape, axes, name: _Kernel(shape, axes, cfg.param_dtype,  # noqa: E731
                                                 name=name)()
        return (make((e, hidden, inner), ("expert", "embed", "mlp"), "gate_proj"),
                make((e, hidden, inner), ("expert", "embed", "mlp"), "up_proj"),
                make((e, inner, hidden), ("expert", "mlp", "embed"), "down_proj"))

    gate, up, down = (w.astype(cfg.dtype) for w in Experts(name="experts")())
    out = grouped_expert_mlp(flat.astype(cfg.dtype), chosen, weights, gate, up, down, e)
    return out.reshape(x.shape)


def sown_routing(intermediates, model_cfg, token_shape) -> dict:
  """What a mixture's layers sowed in a pass over (B, T) tokens, stacked over the layers:
  {"routes": (B, T, L, k) int32, "router_logits": (L, B T, E) float32}; {} for a dense model.
  (The layer scan sows (L, ...) arrays under layers/mlp; the per-layer passes with a KV cache
  sow one per layer at the top.)"""
  if not model_cfg.blocks.mixture:
    return {}
  if "layers" in intermediates:
    sown = {name: value[0] for name, value in intermediates["layers"]["mlp"].items()}
  else:
    sown = {name: jnp.stack(values) for name, values in intermediates.items()}
  batch, length = token_shape
  routes = sown["routes"].reshape(model_cfg.num_layers, batch, length, -1)
  return {"routes": jnp.moveaxis(routes, 0, 2), "router_logits": sown["router_logits"]}


def load_balancing_loss(router_logits: jax.Array, top_k: int, mask: jax.Array | None = None):
  """transformers' load_balancing_loss_func (Switch Transformer's auxiliary loss) over every
  layer's router logits (L, N, E) of the same N tokens, `mask` (N,) True for the real ones:

      E * sum_e f_e * P_e,
      f_e = (the top-k choices of e, over layers and real tokens) / (layers x real tokens),
      P_e = mean over (layer, real token) of softmax(logits)_e."""
  layers, n, e = router_logits.shape
  probs = jax.nn.softmax(router_logits.astype(jnp.float32).reshape(-1, e), axis=-1)
  _, chosen = jax.lax.top_k(probs, top_k)
  one_hot = jax.nn.one_hot(chosen, e)  # (L N, k, E)
  w = (jnp.ones((layers * n,)) if mask is None else
       jnp.tile(mask.astype(jnp.float32), layers))
  tokens_per_expert = jnp.sum(one_hot * w[:, None, None], axis=0) / jnp.sum(w)
  prob_per_expert = jnp.sum(probs * w[:, None], axis=0) / jnp.sum(w)
  return jnp.sum(tokens_per_expert * prob_per_expert[None, :]) * e
