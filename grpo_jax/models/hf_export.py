"""Our params -> Hugging Face checkpoints: a full checkpoint (config.json, model.safetensors,
tokenizer files) and, for LoRA, a PEFT adapter folder (adapter_config.json,
adapter_model.safetensors) that `peft.PeftModel.from_pretrained(model, folder)` loads.

Names and layouts are grpo_jax/models/hf.py's (kernels (in, out) here, (out, in) in torch).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.hf import (ARCHITECTURE_FIELDS, EXPORT_DTYPES, TOKENIZER_FILES,
                                hf_arrays, hf_config_from_model_config, model_config_from_hf,
                                param_layout, read_config, to_hf)
from grpo_jax.models.lora import input_dims

# The weight files of a full checkpoint: one model.safetensors, or shards and their index.
WEIGHT_FILE = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?")


def export_hf_checkpoint(params, model_cfg: ModelConfig, out_dir, source_dir=None,
                         model_type: str = "qwen2", dtype: str = "float32",
                         max_shard_bytes: int = 0) -> pathlib.Path:
  """Writes params as a Hugging Face checkpoint (config.json, model.safetensors, tokenizer).

  config.json is source_dir's (with its dtype set to ``dtype``) when given, else generated for
  model_type; tokenizer and generation files are copied from source_dir when it has them.
  max_shard_bytes > 0 splits the weights into model-0000i-of-0000n.safetensors files of at most
  that size (a larger tensor alone in its file) with model.safetensors.index.json, as
  transformers' save_pretrained(max_shard_size=...) does. Returns out_dir.
  """
  np_dtype = export_dtype(dtype)
  hf_config = (hf_config_from_model_config(model_cfg, model_type, dtype) if source_dir is None
               else _source_config(pathlib.Path(source_dir), model_cfg, dtype))
  tensors = _hf_tensors(params, model_cfg, np_dtype)
  return write_folder(tensors, hf_config, out_dir, max_shard_bytes, source_dir)


def export_vlm_checkpoint(params, cfg, out_dir, source_dir=None, dtype: str = "float32",
                          max_shard_bytes: int = 0) -> pathlib.Path:
  """Writes a vision-language policy ({"vision", "text"} params of a Qwen2.5-VL VlmConfig) as
  a folder that transformers' Qwen2_5_VLForConditionalGeneration loads: config.json
  (qwen2_5_vl_model_hf.vlm_config_to_hf), the decoder's tensors under model.language_model.,
  the tower's under model.visual. (qwen2_5_vl_hf.vision_params_to_hf), lm_head; tokenizer and
  processor files copied from source_dir when it has them. Returns out_dir."""
  from grpo_jax.models.vision.qwen2_5_vl_hf import vision_params_to_hf  # noqa: PLC0415
  from grpo_jax.models.vision.qwen2_5_vl_model_hf import (text_name_to_hf,  # noqa: PLC0415
                                                          vlm_config_to_hf)
  np_dtype = export_dtype(dtype)
  text_cfg = dataclasses.replace(cfg.text, family="llama", mrope_section=())  # Qwen2's tensors
  tensors = {text_name_to_hf(name): array
             for name, array in _hf_tensors(params["text"], text_cfg, np_dtype).items()}
  tensors.update({name: np.ascontiguousarray(np.asarray(array).astype(np_dtype)) for name, array
                  in vision_params_to_hf(jax.device_get(params["vision"]), cfg.vision).items()})
  hf_config = vlm_config_to_hf(cfg, hf_config_from_model_config(text_cfg, "qwen2", dtype), dtype)
  return write_folder(tensors, hf_config, out_dir, max_shard_bytes, source_dir,
                      ("preprocessor_config.json", "chat_template.json"))


def export_dtype(dtype: str) -> np.dtype:
  """The NumPy dtype of an export's `dtype`, one of EXPORT_DTYPES (else one sentence)."""
  if dtype not in EXPORT_DTYPES:
    raise ValueError(f"dtype={dtype!r} is not supported for export; pass one of "
                     f"{', '.join(EXPORT_DTYPES)}.")
  return np.dtype(jnp.dtype(dtype))


def write_folder(tensors: dict, hf_config: dict, out_dir, max_shard_bytes: int = 0,
                 source_dir=None, extra=()) -> pathlib.Path:
  """Writes out_dir: the tensors (save_shards), config.json, and whichever tokenizer files
  (and `extra` files) source_dir has, when given. Returns out_dir."""
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  save_shards(tensors.items(), out_dir, max_shard_bytes)
  (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
  if source_dir is not None:
    _copy_tokenizer_files(pathlib.Path(source_dir), out_dir, extra)
  return out_dir


def save_shards(named_arrays, out_dir: pathlib.Path, max_shard_bytes: int) -> None:
  """(name, array) pairs in one model.safetensors, or, past max_shard_bytes (> 0), in
  model-0000i-of-0000n.safetensors shards of at most that size (a larger tensor alone in its
  own) with model.safetensors.index.json. Holds one shard in memory at a time: each is written
  under a temporary name until the count is known; then the weight files of an earlier export
  in out_dir are removed (a stale model.safetensors would be loaded before a new index) and the
  shards take their names. Stopped part way (an error, an interrupt), it removes its temporary
  files and leaves out_dir's weights as they were."""
  shards, current, size, total = [], {}, 0, 0  # shards: [(temporary file, tensor names)]
  for file in out_dir.glob(".shard-*.safetensors"):  # a killed export's
    file.unlink()

  def flush():
    shards.append((out_dir / f".shard-{len(shards)}.safetensors", list(current)))
    save_file(current, str(shards[-1][0]), metadata={"format": "pt"})

  try:
    for name, array in named_arrays:
      if max_shard_bytes > 0 and current and size + array.nbytes > max_shard_bytes:
        flush()
        current, size = {}, 0
      current[name] = array
      size, total = size + array.nbytes, total + array.nbytes
    flush()
  except BaseException:
    for file, _ in shards:
      file.unlink(missing_ok=True)
    raise
  for file in out_dir.iterdir():
    if WEIGHT_FILE.fullmatch(file.name):
      file.unlink()
  if len(shards) == 1:
    shards[0][0].replace(out_dir / "model.safetensors")
    return
  weight_map = {}
  for i, (file, names) in enumerate(shards):
    final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    file.replace(out_dir / final)
    weight_map.update(dict.fromkeys(names, final))
  index = {"metadata": {"total_size": total}, "weight_map": weight_map}
  (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _source_config(source_dir: pathlib.Path, model_cfg: ModelConfig, dtype: str) -> dict:
  """source_dir's config.json, checked against model_cfg, with its dtype set to dtype."""
  hf_config = read_config(source_dir)
  source_cfg = model_config_from_hf(hf_config)
  for field in ARCHITECTURE_FIELDS:
    ours, theirs = getattr(model_cfg, field), getattr(source_cfg, field)
    if ours != theirs:
      raise ValueError(f"model_cfg.{field}={ours!r} but {source_dir}/config.json implies "
                       f"{theirs!r}; pass the source_dir the params were loaded from.")
  hf_config = {**hf_config, "dtype": dtype}  # (in place when present, else appended)
  if "torch_dtype" in hf_config:
    hf_config["torch_dtype"] = dtype
  return hf_config


def _hf_tensors(params, model_cfg: ModelConfig, dtype: np.dtype) -> dict:
  """{HF name: contiguous torch-layout array in dtype}, checking params' structure."""
  layout, treedef = param_layout(model_cfg)
  if jax.tree.structure(params) != treedef:
    raise ValueError("params do not have the structure of init_params(model_cfg, key); pass "
                     "the ModelConfig the params were built or loaded with.")
  tensors = {}
  for t, array in hf_arrays(layout, params):
    if array.shape != t.shape:
      raise ValueError(f"param {'/'.join(t.path)} has shape {array.shape} but model_cfg implies "
                       f"{t.shape}; pass the ModelConfig the params were built or loaded with.")
    tensors[t.name] = np.ascontiguousarray(to_hf(array, t.path).astype(dtype))
  return tensors


def _copy_tokenizer_files(source_dir: pathlib.Path, out_dir: pathlib.Path, extra=()) -> None:
  """out_dir's tokenizer / generation files (and `extra` files) are source_dir's: those it has
  copied, those it lacks removed (an earlier export's chat template would be read instead of the
  source's own). Nothing to do when out_dir is source_dir."""
  if out_dir.resolve() == source_dir.resolve():
    return
  for name in TOKENIZER_FILES + tuple(extra):
    if (source_dir / name).is_file():
      shutil.copyfile(source_dir / name, out_dir / name)
    else:
      (out_dir / name).unlink(missing_ok=True)


def _target_modules(targets: list, layers_prefix: str):
  """PEFT's target_modules: the projection names, or (a decoder inside a larger model) a
  regular expression matching them under that decoder only."""
  inside = layers_prefix.removeprefix("base_model.model.").removesuffix(".layers")
  if inside == "model":
    return targets
  return re.escape(inside) + r"\.layers\.\d+\..*\.(" + "|".join(targets) + ")"


def export_peft_adapter(adapters, model_cfg: ModelConfig, out_dir, *, rank: int, alpha: float,
                        use_rslora: bool = False, base_model: str = "",
                        layers_prefix: str = "base_model.model.model.layers") -> pathlib.Path:
  """Writes LoRA adapters in PEFT's format: adapter_model.safetensors with PEFT's names
  (``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`` (r, in) and ``lora_B``
  (out, r), float32) and adapter_config.json (LORA, CAUSAL_LM, r, lora_alpha, targets).
  layers_prefix: where the decoder's layers sit in the base model (a Qwen2.5-VL's:
  base_model.model.model.language_model.layers; target_modules then a regular expression
  naming only that decoder's projections, not the vision tower's of the same names). Returns
  out_dir."""
  tensors, targets = {}, set()
  for index in range(model_cfg.num_layers):
    for parent, projections in adapters["layers"].items():
      for name, ad in projections.items():
        targets.add(name)
        a = np.asarray(jax.device_get(ad["lora_a"][index]), np.float32)
        b = np.asarray(jax.device_get(ad["lora_b"][index]), np.float32)
        k = input_dims(name)
        prefix = f"{layers_prefix}.{index}.{parent}.{name}"
        tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(
            a.reshape(math.prod(a.shape[:k]), rank).T)
        tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b.reshape(rank, -1).T)
  config = {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
      "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "use_rslora": use_rslora,
      "target_modules": _target_modules(sorted(targets), layers_prefix), "bias": "none", "fan_in_fan_out": False,
      "init_lora_weights": True, "inference_mode": True, "modules_to_save": None}
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
  (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
  return out_dir
