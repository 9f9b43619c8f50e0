"""The whole Qwen2.5-VL model (qwen2_5_vl_model.py) <-> Hugging Face: its config.json and
state dict.

Config. transformers 5 writes a ``text_config`` (model_type ``qwen2_5_vl_text``) beside the
``vision_config``; the released checkpoints (4.x) keep the text fields at the top level, with
``rope_scaling = {"type": "mrope", "mrope_section": [...]}``. Either way the text decoder is
read as a ``qwen2`` config.json (models/hf.model_config_from_hf) whose rope type is the
default one, mrope_section taken out (VlmConfig.mrope_section); ``tie_word_embeddings`` is the
top level's when it is there (HF reads it there), else the text section's.

Tensors. transformers 5 names the decoder ``model.language_model.*`` (``embed_tokens``,
``layers.i...``, ``norm``) and the head ``lm_head.weight``; 4.x checkpoints ``model.*`` and
``lm_head.weight``. The decoder's tensors map to our params as a text model's do
(models/hf_names.py), the vision encoder's as qwen2_5_vl_hf.py says.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from grpo_jax.errors import InputError
from grpo_jax.models.hf import model_config_from_hf
from grpo_jax.models.hf_names import _from_hf, param_layout, params_from_hf
from grpo_jax.models.vision.qwen2_5_vl import vision_config_from_hf
from grpo_jax.models.vision.qwen2_5_vl_hf import tensor_prefix, vision_params_from_hf
from grpo_jax.models.vision.qwen2_5_vl_model import VlmConfig

TEXT_PREFIXES = ("model.language_model.", "model.")  # transformers 5.x, 4.x checkpoints
_MROPE_TYPES = ("mrope", "default")  # "mrope" (4.x configs) is the default frequencies


def _text_section(hf_config: dict) -> dict:
  """The text decoder's fields as a qwen2 config.json, mrope_section taken out of the rope."""
  text = dict(hf_config.get("text_config") or hf_config)
  rope = dict(text.get("rope_parameters") or text.get("rope_scaling")
              or hf_config.get("rope_scaling") or {})
  rope.pop("mrope_section", None)
  rope_type = rope.pop("rope_type", rope.pop("type", "default"))
  rope["rope_type"] = "default" if rope_type in _MROPE_TYPES else rope_type
  rope.setdefault("rope_theta", text.get("rope_theta", hf_config.get("rope_theta", 1e6)))
  tie = hf_config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
  text.pop("rope_scaling", None)
  return {**text, "model_type": "qwen2", "rope_parameters": rope,
          "tie_word_embeddings": bool(tie)}


def mrope_section_of(hf_config: dict) -> tuple:
  """rope_parameters.mrope_section (5.x text_config) or rope_scaling.mrope_section (4.x)."""
  text = hf_config.get("text_config") or hf_config
  for rope in (text.get("rope_parameters"), text.get("rope_scaling"),
               hf_config.get("rope_scaling")):
    if rope and rope.get("mrope_section"):
      return tuple(int(v) for v in rope["mrope_section"])
  raise InputError("config.json has no rope_parameters.mrope_section; load a Qwen2.5-VL "
                   "config.json (its text_config, or rope_scaling in older files).")


def vlm_config_from_hf(hf_config: dict, param_dtype: str = "float32",
                       compute_dtype: str = "float32") -> VlmConfig:
  """The VlmConfig of a Qwen2.5-VL config.json (as a dict, 5.x or 4.x layout)."""
  return VlmConfig(
      text=model_config_from_hf(_text_section(hf_config), param_dtype, compute_dtype),
      vision=vision_config_from_hf(hf_config, param_dtype, compute_dtype),
      mrope_section=mrope_section_of(hf_config),
      image_token_id=int(hf_config.get("image_token_id", 151655)))


# The decoder's tensors are missing: one sentence.
TEXT_MISSING = ("the state dict has no Qwen2.5-VL text decoder (no model.language_model."
                "embed_tokens.weight or model.embed_tokens.weight); load a Qwen2.5-VL "
                "checkpoint.")


def text_params_from_hf(tensors: Mapping, cfg: VlmConfig, dtype=np.float32):
  """The decoder's params (models/decoder.py layout) from a Qwen2.5-VL state dict; a missing
  or misshapen tensor is one sentence naming it."""
  prefix = tensor_prefix(tensors.keys(), TEXT_PREFIXES, "embed_tokens.weight", TEXT_MISSING)
  layout, treedef = param_layout(cfg.text)
  arrays = {}
  for t in layout:
    name = text_name_to_hf(t.name).replace(TEXT_PREFIXES[0], prefix, 1)
    if name not in tensors:
      raise InputError(f"the state dict lacks {name}; load a complete Qwen2.5-VL checkpoint "
                       f"whose text_config matches.")
    array = np.asarray(tensors[name], dtype=np.float32)
    if array.shape != t.hf_shape:
      raise InputError(f"{name} has shape {array.shape}, the text config needs {t.hf_shape}; "
                       f"use the config.json that came with the checkpoint.")
    arrays[t.name] = _from_hf(array, t.path, t.shape)
  return params_from_hf(layout, treedef, arrays, dtype)


def vlm_params_from_hf(tensors: Mapping, cfg: VlmConfig, dtype=np.float32) -> dict:
  """{"vision": ..., "text": ...} params of qwen2_5_vl_model.vlm_logits from a state dict
  {HF name: array-like} (transformers 5.x or 4.x names)."""
  return {"vision": vision_params_from_hf(tensors, cfg.vision, dtype),
          "text": text_params_from_hf(tensors, cfg, dtype)}


VISION_EXPORT_FIELDS = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels",
                        "patch_size", "temporal_patch_size", "spatial_merge_size", "window_size",
                        "out_hidden_size", "hidden_act")


def vlm_config_to_hf(cfg: VlmConfig, text_config: dict, dtype: str = "float32") -> dict:
  """A Qwen2.5-VL config.json (transformers 5's layout) for cfg; text_config: the decoder's
  qwen2 config.json (hf.hf_config_from_model_config), the mRoPE split added to its rope."""
  text = {k: v for k, v in text_config.items() if k not in ("architectures", "model_type")}
  text["rope_parameters"] = {**text["rope_parameters"],
                             "mrope_section": [int(v) for v in cfg.mrope_section]}
  vision = {k: getattr(cfg.vision, k) for k in VISION_EXPORT_FIELDS}
  vision["fullatt_block_indexes"] = [int(i) for i in cfg.vision.fullatt_block_indexes]
  return {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
          "text_config": text, "vision_config": vision, "image_token_id": cfg.image_token_id,
          "tie_word_embeddings": cfg.text.tie_embeddings, "dtype": dtype}


def text_name_to_hf(name: str) -> str:
  """A decoder tensor's name in a Qwen2.5-VL state dict (transformers 5): model.X ->
  model.language_model.X; lm_head.weight as it is."""
  return TEXT_PREFIXES[0] + name[len("model."):] if name.startswith("model.") else name
