"""The Llama family: Llama, Mistral, Qwen2 and Qwen3 on Llama's blocks (models/blocks.py
`Blocks`: RMSNorm, SwiGLU, pre-norm layers). They differ only in what config.json switches:
q/k/v biases (Qwen2), per-head q/k norms (Qwen3, with head_dim 128 by default) and sliding
windows (Mistral's on every layer, Qwen's from max_window_layers on or by layer_types)."""

from __future__ import annotations

from typing import Optional

from grpo_jax.models.blocks import Blocks
from grpo_jax.models.families.registry import ModelFamily, register_blocks, register_model_family


def window_unless_null(hf_config: dict) -> Optional[int]:
  """sliding_window unless it is null; 4096 when absent (transformers' default for Mistral)."""
  return hf_config.get("sliding_window", 4096)


def window_layer_types(hf_config: dict) -> tuple:
  """Which layers attend within the window, as transformers 5 decides it: config.json's
  layer_types, else from max_window_layers on (Qwen2 / Qwen3), else every layer (Mistral; an
  empty tuple)."""
  if hf_config.get("layer_types"):
    return tuple(hf_config["layer_types"])
  if "max_window_layers" in hf_config:
    first = int(hf_config["max_window_layers"])
    return tuple("sliding_attention" if i >= first else "full_attention"
                 for i in range(int(hf_config["num_hidden_layers"])))
  return ()


def mistral_window_config(model_cfg) -> dict:
  """Mistral's config.json entries for a model with a sliding window (on every layer)."""
  if model_cfg.layer_types and set(model_cfg.layer_types) != {"sliding_attention"}:
    raise ValueError("model_type='mistral' windows every layer; this model has full-attention "
                     "layers too: export it as qwen2 or qwen3.")
  return {"sliding_window": model_cfg.sliding_window or None}


def qwen_window_config(model_cfg) -> dict:
  """Qwen2 / Qwen3's config.json entries for a model with a sliding window."""
  if not model_cfg.sliding_window:
    return {}
  types = list(model_cfg.layer_types) or ["sliding_attention"] * model_cfg.num_layers
  first = next((i for i, t in enumerate(types) if t == "sliding_attention"), len(types))
  return {"use_sliding_window": True, "sliding_window": model_cfg.sliding_window,
          "max_window_layers": first, "layer_types": types}


register_blocks(Blocks())
register_model_family(ModelFamily(
    "llama", "LlamaForCausalLM", export_extras=(("attention_bias", False), ("mlp_bias", False))))
register_model_family(ModelFamily(
    "mistral", "MistralForCausalLM", sliding_window=window_unless_null,
    export_extras=(("attention_bias", False), ("sliding_window", None)),
    window_config=mistral_window_config))
register_model_family(ModelFamily(
    "qwen2", "Qwen2ForCausalLM", qkv_bias=True, reads_attention_bias=False,
    export_extras=(("use_sliding_window", False),), window_config=qwen_window_config))
register_model_family(ModelFamily(
    "qwen3", "Qwen3ForCausalLM", qk_norm=True, default_head_dim=128,
    export_extras=(("attention_bias", False), ("use_sliding_window", False)),
    window_config=qwen_window_config))
