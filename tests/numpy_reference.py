"""An independent NumPy (float64) forward pass of the Llama/Qwen decoder, written from the
architecture's definition with plain loops, to check the Flax model against."""

import jax
import numpy as np


def _rms_norm(x, w, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, positions, theta):
  # x: (T, H, D), positions: (T,)
  d = x.shape[-1]
  out = np.empty_like(x)
  for t, pos in enumerate(positions):
    for i in range(d // 2):
      angle = pos * theta ** (-2.0 * i / d)
      c, s = np.cos(angle), np.sin(angle)
      a, b = x[t, :, i], x[t, :, i + d // 2]
      out[t, :, i] = a * c - b * s
      out[t, :, i + d // 2] = b * c + a * s
  return out


def _silu(x):
  return x / (1 + np.exp(-x))


def forward(params, cfg, tokens, mask, parallel=False, activation=_silu):
  """Logits (T, V) for one row; tokens (T,), mask (T,) bool (False = padding). parallel: the
  layer is x + attn(norm(x)) + mlp(norm(x)) with one norm (GPT-J / PaLM), else Llama's
  x + attn(norm(x)), then + mlp(norm(.)); activation: the MLP gate's."""
  p = {k: v for k, v in params.items()}
  f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
  emb = f64(p["embed_tokens"]["embedding"])
  x = emb[np.asarray(tokens)]
  positions = np.maximum(np.cumsum(mask) - 1, 0)
  t_len = len(tokens)
  group = cfg.num_heads // cfg.num_kv_heads
  for layer in range(cfg.num_layers):
    lp = jax.tree.map(lambda a, i=layer: np.asarray(a)[i], p["layers"])  # this layer's slice
    att = lp["self_attn"]
    h = _rms_norm(x, f64(lp["input_layernorm"]["weight"]), cfg.rms_norm_eps)
    # q/k/v kernels (embed, heads, head_dim), biases (heads, head_dim): flattened here
    proj = lambda name: h @ f64(att[name]["kernel"]).reshape(h.shape[-1], -1) + (  # noqa: E731
        f64(att[name]["bias"]).reshape(-1) if "bias" in att[name] else 0.0)
    q = proj("q_proj").reshape(t_len, cfg.num_heads, cfg.head_dim)
    k = proj("k_proj").reshape(t_len, cfg.num_kv_heads, cfg.head_dim)
    v = proj("v_proj").reshape(t_len, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
      q = _rms_norm(q, f64(att["q_norm"]["weight"]), cfg.rms_norm_eps)
      k = _rms_norm(k, f64(att["k_norm"]["weight"]), cfg.rms_norm_eps)
    q, k = _rope(q, positions, cfg.rope_theta), _rope(k, positions, cfg.rope_theta)
    out = np.zeros((t_len, cfg.num_heads, cfg.head_dim))
    for head in range(cfg.num_heads):
      kv = head // group
      for i in range(t_len):
        keys = [j for j in range(i + 1) if mask[j]]
        if not keys:  # a padding query with nothing to see: uniform over all causal keys
          keys = list(range(i + 1))
          scores = np.zeros(len(keys))
        else:
          scores = np.array([q[i, head] @ k[j, kv] for j in keys]) / np.sqrt(cfg.head_dim)
        w = np.exp(scores - scores.max())
        w /= w.sum()
        out[i, head] = sum(wj * v[j, kv] for wj, j in zip(w, keys))
    attended = out.reshape(t_len, -1) @ f64(att["o_proj"]["kernel"]).reshape(-1, x.shape[-1])
    if not parallel:
      x = x + attended
      h = _rms_norm(x, f64(lp["post_attention_layernorm"]["weight"]), cfg.rms_norm_eps)
    mlp = lp["mlp"]
    gate = h @ f64(mlp["gate_proj"]["kernel"])
    hidden = activation(gate) * (h @ f64(mlp["up_proj"]["kernel"]))
    x = x + (attended if parallel else 0.0) + hidden @ f64(mlp["down_proj"]["kernel"])
  x = _rms_norm(x, f64(p["norm"]["weight"]), cfg.rms_norm_eps)
  if cfg.tie_embeddings:
    return x @ emb.T
  return x @ f64(p["lm_head"]["kernel"])
