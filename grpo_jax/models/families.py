"""Model families: how each Hugging Face ``model_type`` maps onto our one decoder.

The decoder (models/decoder.py) is a Llama-style stack; a family says what its config.json
means for it: q/k/v biases, per-head q/k RMS norms, the head_dim default, how sliding-window
attention is switched on, and the keys an exported config.json gets. models/hf.py reads only
these fields and never names a model_type itself.

To add a family (another Llama variant, say), register it once, here or in a module imported
before loading or exporting:

    register_model_family(ModelFamily(
        model_type="my_llama", architecture="MyLlamaForCausalLM",
        export_extras=(("attention_bias", False), ("mlp_bias", False))))

Its tensors must be named like Llama's (``model.layers.N.self_attn.q_proj.weight``, ...), and
it must use SwiGLU MLPs and RMSNorm: the loader checks names and shapes. Sliding windows
(Mistral's on every layer, Qwen's from max_window_layers on or by layer_types) load into the
decoder's ModelConfig.sliding_window / layer_types when the family has a window_config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional


def window_if_enabled(hf_config: dict) -> Optional[int]:
  """sliding_window when use_sliding_window is true, else None (Qwen, Llama)."""
  return hf_config.get("sliding_window") if hf_config.get("use_sliding_window") else None


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


@dataclasses.dataclass(frozen=True)
class ModelFamily:
  """One config.json ``model_type`` and what it implies for the decoder."""

  model_type: str  # config.json's "model_type".
  architecture: str  # config.json's "architectures" entry on export.
  qkv_bias: bool = False  # Biases on q/k/v (Qwen2).
  qk_norm: bool = False  # RMS norm of q and k per head (Qwen3).
  default_head_dim: Optional[int] = None  # When config.json has none; None: hidden / heads.
  # False: config.json's attention_bias is ignored (Qwen2's q/k/v biases are always there).
  reads_attention_bias: bool = True
  # config.json -> its sliding-window size, or None for full attention; and ModelConfig -> the
  # config.json entries that say so on export (None: the family has no windows here).
  sliding_window: Callable[[dict], Optional[int]] = window_if_enabled
  window_config: Optional[Callable[[Any], dict]] = None
  # (key, value) pairs appended, in order, to a config.json that export generates.
  export_extras: tuple[tuple[str, Any], ...] = ()
  # A family unlike Llama beyond the fields above (Gemma, grpo_jax/models/gemma.py): config.json
  # -> further ModelConfig fields (checking its own activation and windows), and ModelConfig ->
  # the config.json entries that describe them on export.
  read_extras: Optional[Callable[[dict], dict]] = None
  gemma_norms: bool = False  # the (1 + w) norms and the rest of gemma.py's list
  experts: bool = False  # a mixture of experts in every layer (models/moe.py)
  # config.json -> the config.json whose rope_parameters describe the (global) RoPE, where the
  # family nests them (Gemma 3: per layer type).
  rope_config: Optional[Callable[[dict], dict]] = None
  write_extras: Optional[Callable[[Any], dict]] = None


MODEL_FAMILIES: dict[str, ModelFamily] = {}


def register_model_family(family: ModelFamily, replace: bool = False) -> ModelFamily:
  """Adds family under its model_type; a taken model_type raises unless replace=True."""
  taken = MODEL_FAMILIES.get(family.model_type)
  if taken is not None and taken != family and not replace:
    raise ValueError(f"model_type={family.model_type!r} is registered already; pick another "
                     f"model_type or pass replace=True.")
  MODEL_FAMILIES[family.model_type] = family
  return family


def find_model_family(model_type) -> Optional[ModelFamily]:
  """The family registered under model_type, or None (also for a non-string model_type)."""
  return MODEL_FAMILIES.get(model_type) if isinstance(model_type, str) else None


def model_types() -> tuple[str, ...]:
  """The registered model_types, sorted."""
  return tuple(sorted(MODEL_FAMILIES))


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

