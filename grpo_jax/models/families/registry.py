"""The registries of model families (models/families/__init__.py says how to add one): the
blocks by model.family, the Hugging Face model_types by config.json's model_type."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from grpo_jax.models.blocks import Blocks
from grpo_jax.registry import Registry


def window_if_enabled(hf_config: dict) -> Optional[int]:
  """sliding_window when use_sliding_window is true, else None (Qwen, Llama)."""
  return hf_config.get("sliding_window") if hf_config.get("use_sliding_window") else None


@dataclasses.dataclass(frozen=True)
class ModelFamily:
  """One config.json ``model_type`` and what it implies for the decoder."""

  model_type: str  # config.json's "model_type".
  architecture: str  # config.json's "architectures" entry on export.
  qkv_bias: bool = False  # Biases on q/k/v (Qwen2).
  qk_norm: bool = False  # RMS norm of q and k per head (Qwen3).
  default_head_dim: Optional[int] = None  # When config.json has none; None: hidden / heads.
  # tie_word_embeddings when config.json leaves it out: its transformers config class's
  # default (Gemma's released configs omit it, and their weights have no lm_head).
  tie_default: bool = False
  # False: config.json's attention_bias is ignored (Qwen2's q/k/v biases are always there).
  reads_attention_bias: bool = True
  # config.json -> its sliding-window size, or None for full attention; and ModelConfig -> the
  # config.json entries that say so on export (None: the family has no windows here).
  sliding_window: Callable[[dict], Optional[int]] = window_if_enabled
  window_config: Optional[Callable[[Any], dict]] = None
  # (key, value) pairs appended, in order, to a config.json that export generates.
  export_extras: tuple[tuple[str, Any], ...] = ()
  # A family unlike Llama beyond the fields above (Gemma): config.json -> further ModelConfig
  # fields (checking its own activation and windows), and ModelConfig -> the config.json
  # entries that describe them on export.
  read_extras: Optional[Callable[[dict], dict]] = None
  blocks: str = "llama"  # the decoder's blocks (register_blocks): ModelConfig.family
  # config.json -> the config.json whose rope_parameters describe the (global) RoPE, where the
  # family nests them (Gemma 3: per layer type).
  rope_config: Optional[Callable[[dict], dict]] = None
  write_extras: Optional[Callable[[Any], dict]] = None


MODEL_FAMILIES: dict[str, ModelFamily] = {}
BLOCKS = Registry("model.family")  # the decoder's blocks by family name


def register_model_family(family: ModelFamily, replace: bool = False) -> ModelFamily:
  """Adds family under its model_type; a taken model_type raises unless replace=True."""
  taken = MODEL_FAMILIES.get(family.model_type)
  if taken is not None and taken != family and not replace:
    raise ValueError(f"model_type={family.model_type!r} is registered already; pick another "
                     f"model_type or pass replace=True.")
  MODEL_FAMILIES[family.model_type] = family
  return family


def register_blocks(blocks: Blocks, replace: bool = False) -> Blocks:
  """Adds a family's blocks under blocks.name (model.family); a taken name raises unless
  replace=True."""
  return BLOCKS.register(blocks.name, blocks, replace=replace)


def find_model_family(model_type) -> Optional[ModelFamily]:
  """The family registered under model_type, or None (also for a non-string model_type)."""
  return MODEL_FAMILIES.get(model_type) if isinstance(model_type, str) else None


def model_types() -> tuple[str, ...]:
  """The registered model_types, sorted."""
  return tuple(sorted(MODEL_FAMILIES))

