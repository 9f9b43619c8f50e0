"""Hugging Face checkpoints <-> our decoder params: config.json and safetensors loading (the
tensor names: models/hf_names.py; export: models/hf_export.py).

Supported ``model_type``s: those registered by the family modules (models/families/: llama,
mistral, qwen2 and qwen3; gemma2 and gemma3_text; qwen3_moe) or by a plugin.

Hugging Face's per-layer names exist only at this edge; our params keep one layout, the layers
stacked, kernels (in, out) with attention heads as a dimension (models/hf_names.py). Nothing
here touches the network: download a checkpoint first, e.g. ``hf download
Qwen/Qwen2.5-0.5B-Instruct --local-dir PATH``.

bfloat16 tensors are read through safetensors' NumPy API as ``ml_dtypes.bfloat16`` arrays (the
dtype jax registers with NumPy; safetensors >= 0.5 understands it) and cast to ``param_dtype``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import pathlib

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open

from grpo_jax.errors import InputError, first_line, json_limit
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.hf_names import (_from_hf, hf_arrays, param_layout,  # noqa: F401
                                      params_from_hf, to_hf)
from grpo_jax.models.rope import rope_fields
from grpo_jax.models.families import (MODEL_FAMILIES, ModelFamily, find_model_family,
                                      model_types)
from grpo_jax.models.families.llama import window_layer_types

EXPORT_DTYPES = ("float32", "bfloat16", "float16")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json", "generation_config.json",
    "chat_template.jinja")
_EXAMPLE_REPO = "Qwen/Qwen2.5-0.5B-Instruct"
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                        "num_heads", "num_kv_heads", "head_dim", "rope_theta", "rope_type",
                        "rope_scaling", "rms_norm_eps", "tie_embeddings", "family", "qkv_bias",
                        "qk_norm")


# ----------------------------------------------------------------------------- config.json


def model_config_from_hf(hf_config: dict, param_dtype: str = "float32",
                         compute_dtype: str = "float32") -> ModelConfig:
  """The ModelConfig of a Hugging Face config.json (as a dict)."""
  model_type = hf_config.get("model_type")
  family = find_model_family(model_type)
  if family is None:
    if model_type is None and "train" in hf_config and "rl" in hf_config:  # a run's workdir
      raise ValueError("config.json is a grpo_jax run's config, not a model's: this folder is "
                       "a training run's workdir; give its hf_export folder (written with "
                       "--config.train.export=True) as the model.")
    raise ValueError(
        f"config.json model_type={model_type!r} is not supported; use a checkpoint of one of "
        f"{', '.join(model_types())}.")
  _check_supported_features(hf_config, family)
  for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads"):
    value = _require(hf_config, key)
    if not (isinstance(value, int) and value >= 1):
      raise ValueError(f"config.json {key}={value!r}; a decoder needs a whole number >= 1 there: "
                       f"use the config.json that came with the checkpoint.")
  heads = _require(hf_config, "num_attention_heads")
  return ModelConfig(
      vocab_size=_require(hf_config, "vocab_size"),
      hidden_size=_require(hf_config, "hidden_size"),
      intermediate_size=_require(hf_config, "intermediate_size"),
      num_layers=_require(hf_config, "num_hidden_layers"),
      num_heads=heads,
      num_kv_heads=hf_config.get("num_key_value_heads") or heads,
      # head_dim defaults like transformers': the family's (e.g. Qwen3's 128), else hidden / heads
      head_dim=(int(hf_config["head_dim"]) if hf_config.get("head_dim") else
                family.default_head_dim if family.default_head_dim is not None else
                hf_config["hidden_size"] // heads),
      **rope_fields(family.rope_config(hf_config) if family.rope_config else hf_config),
      rms_norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(hf_config.get("tie_word_embeddings", family.tie_default)),
      family=family.blocks,
      qkv_bias=family.qkv_bias,
      qk_norm=family.qk_norm,
      max_position_embeddings=int(hf_config.get("max_position_embeddings") or 0),
      param_dtype=param_dtype,
      compute_dtype=compute_dtype,
      **(family.read_extras(hf_config) if family.read_extras else _window(hf_config, family)))


def hf_config_from_model_config(model_cfg: ModelConfig, model_type: str = "qwen2",
                                dtype: str = "float32") -> dict:
  """A minimal config.json (transformers-5 style, plus rope_theta for 4.x) for model_cfg."""
  family = _export_family(model_cfg, model_type)
  rope_parameters = {"rope_type": model_cfg.rope_type, "rope_theta": model_cfg.rope_theta,
                     **dict(model_cfg.rope_scaling)}
  hf_config = {
      "architectures": [family.architecture],
      "model_type": family.model_type,
      "vocab_size": model_cfg.vocab_size,
      "hidden_size": model_cfg.hidden_size,
      "intermediate_size": model_cfg.intermediate_size,
      "num_hidden_layers": model_cfg.num_layers,
      "num_attention_heads": model_cfg.num_heads,
      "num_key_value_heads": model_cfg.num_kv_heads,
      "head_dim": model_cfg.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": model_cfg.rms_norm_eps,
      "tie_word_embeddings": model_cfg.tie_embeddings,
      "rope_parameters": rope_parameters,
      "rope_theta": model_cfg.rope_theta,
      "dtype": dtype,
  }
  if model_cfg.rope_type != "default":  # transformers 4.x reads the scaling from rope_scaling
    hf_config["rope_scaling"] = rope_parameters
  if model_cfg.max_position_embeddings:
    hf_config["max_position_embeddings"] = model_cfg.max_position_embeddings
  hf_config.update(family.export_extras)
  if family.window_config and not family.read_extras:
    hf_config.update(family.window_config(model_cfg))
  if family.write_extras:
    hf_config.update(family.write_extras(model_cfg))
  return hf_config


def _require(hf_config: dict, key: str):
  """hf_config[key], or a clear error when config.json lacks it."""
  if hf_config.get(key) is None:
    raise ValueError(f"config.json has no {key!r}; use the config.json that came with the "
                     f"checkpoint.")
  return hf_config[key]


def _window(hf_config: dict, family: ModelFamily) -> dict:
  """ModelConfig's sliding_window and layer_types of a Llama-like family's config.json."""
  window = family.sliding_window(hf_config)
  if not window:
    return {}
  return dict(sliding_window=int(window), layer_types=window_layer_types(hf_config))


def _check_supported_features(hf_config: dict, family: ModelFamily) -> None:
  """Raises on config.json options that the decoder cannot represent."""
  if family.read_extras:  # the family reads (and checks) its own activation and windows
    return
  act = hf_config.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"config.json hidden_act={act!r} is not supported; the decoder's MLP is "
                     f"SwiGLU (hidden_act='silu').")
  if family.reads_attention_bias and hf_config.get("attention_bias"):
    raise ValueError("config.json attention_bias=true puts a bias on o_proj, which the decoder "
                     "does not have; only Qwen2-style q/k/v biases are supported.")
  if hf_config.get("mlp_bias"):
    raise ValueError("config.json mlp_bias=true is not supported; the decoder's MLP has no "
                     "biases.")
  window = family.sliding_window(hf_config)
  if window is not None and family.window_config is None:
    raise ValueError(f"config.json asks for sliding-window attention (sliding_window={window}), "
                     f"which model_type={family.model_type!r} does not have in transformers; "
                     f"use a checkpoint with full attention.")


def _export_family(model_cfg: ModelConfig, model_type: str) -> ModelFamily:
  """model_type's family; raises unless it describes model_cfg: its blocks, q/k/v biases, q/k
  norms and sliding windows."""
  family = find_model_family(model_type)
  if family is None:
    raise ValueError(f"model_type={model_type!r} is not supported; pass one of "
                     f"{', '.join(model_types())}.")

  def fits(f: ModelFamily) -> bool:
    return (f.blocks == model_cfg.family and (f.qkv_bias, f.qk_norm) == (
        model_cfg.qkv_bias, model_cfg.qk_norm) and not (
            model_cfg.sliding_window and not (f.window_config or f.read_extras)))
  if not fits(family):
    others = [t for t, f in sorted(MODEL_FAMILIES.items()) if fits(f)]
    raise ValueError(
        f"model_type={model_type!r} does not describe this model (family {model_cfg.family!r}, "
        f"qkv_bias={model_cfg.qkv_bias}, qk_norm={model_cfg.qk_norm}, sliding_window="
        f"{model_cfg.sliding_window}); pass {' or '.join(others) or 'a model_type of its family'}.")
  return family


def _preview(names) -> str:
  """The first few names, comma-separated, with a count of the rest."""
  names = sorted(names)
  more = f" (+{len(names) - 5} more)" if len(names) > 5 else ""
  return ", ".join(names[:5]) + more


# ----------------------------------------------------------------------------- loading


def load_hf_checkpoint(path, param_dtype: str = "float32", compute_dtype: str = "float32"):
  """(ModelConfig, params) of a local Hugging Face checkpoint directory (safetensors weights).

  params has exactly the structure of ``init_params(cfg, key)``, cast to param_dtype.
  """
  path = pathlib.Path(path)
  with loading_errors(f"model.path={path}"):
    model_cfg = model_config_from_hf(read_config(path), param_dtype, compute_dtype)
    weight_map = _weight_map(path)
    layout, treedef = param_layout(model_cfg)
    _check_tensor_names({t.name for t in layout}, set(weight_map), model_cfg)
    arrays = _read_tensors(weight_map, layout, jnp.dtype(param_dtype))
  return model_cfg, params_from_hf(layout, treedef, arrays, jnp.dtype(param_dtype))


@contextlib.contextmanager
def loading_errors(where: str):
  """A checkpoint's loading error as one InputError sentence naming the folder (`where: ...`);
  an InputError as it is."""
  try:
    yield
  except InputError:
    raise
  except (OSError, ValueError, KeyError, SafetensorError) as e:
    raise InputError(f"{where}: {str(e).strip() or first_line(e)}") from None


def _download_hint(path) -> str:
  return f"`hf download {_EXAMPLE_REPO} --local-dir {path}`"


VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")  # a tokenizer has one


def has_tokenizer_files(path) -> bool:
  return any((pathlib.Path(path) / f).is_file() for f in VOCABULARY_FILES)


def same_vocabulary(path, tokenizer) -> bool:
  """Whether the checkpoint folder `path` has no tokenizer (it reads `tokenizer`'s ids) or one
  with `tokenizer`'s vocabulary."""
  path = pathlib.Path(path)
  if not has_tokenizer_files(path):
    return True
  vocab = getattr(tokenizer, "get_vocab", None)
  if vocab is None:
    return False
  from transformers import AutoTokenizer  # noqa: PLC0415
  return AutoTokenizer.from_pretrained(path).get_vocab() == vocab()


def read_config(path: pathlib.Path) -> dict:
  """The checkpoint's config.json as a dict."""
  if not path.is_dir():
    raise InputError(f"No checkpoint directory at {path}; download a Hugging Face "
                            f"checkpoint there first, e.g. {_download_hint(path)}.")
  config_file = path / "config.json"
  if not config_file.is_file():
    raise InputError(f"{path} has no config.json; point at a full Hugging Face "
                            f"checkpoint directory, e.g. one from {_download_hint(path)}.")
  try:
    config = json.loads(config_file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise InputError(f"{config_file} is not valid JSON ({first_line(e)}); restore the "
                     f"checkpoint's own config.json.") from None
  except (ValueError, RecursionError) as e:  # valid JSON that Python's json cannot read
    raise InputError(f"{config_file} {json_limit(e, fix=False)}; restore the checkpoint's own "
                     f"config.json.") from None
  if not isinstance(config, dict):
    raise InputError(f"{config_file} holds a {type(config).__name__}, not a JSON object; restore "
                     f"the checkpoint's own config.json.")
  return config


def _weight_map(path: pathlib.Path) -> dict:
  """{tensor name: safetensors file} from model.safetensors or its sharded index."""
  index = path / "model.safetensors.index.json"
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
      return {name: path / file for name, file in weight_map.items()}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
            AttributeError) as e:
      why = first_line(e)
    except (ValueError, RecursionError) as e:  # valid JSON that Python's json cannot read
      why = f"it {json_limit(e, fix=False)}"
    raise InputError(f"{index} is not a safetensors index (a JSON object whose weight_map maps "
                     f"tensor names to files; {why}): download or export the checkpoint "
                     f"again.")
  single = path / "model.safetensors"
  if single.is_file():
    with _open_safetensors(single) as f:
      return {name: single for name in f.keys()}
  raise InputError(
      f"{path} has no model.safetensors or model.safetensors.index.json (.bin weights are not "
      f"read); download safetensors weights with {_download_hint(path)}.")


def _open_safetensors(file):
  """safe_open(file), or an InputError naming the file when its header cannot be read."""
  try:
    return safe_open(str(file), framework="np")
  except (SafetensorError, OSError) as e:
    raise InputError(f"{file} cannot be read as safetensors ({first_line(e)}): the file is "
                     f"truncated or damaged; download or export it again.") from None


def _check_tensor_names(expected: set, found: set, model_cfg: ModelConfig) -> None:
  """Raises when the checkpoint lacks a tensor the config implies, or has one we cannot use."""
  ignorable = {n for n in found if n.endswith("rotary_emb.inv_freq")}
  if model_cfg.tie_embeddings:
    ignorable.add("lm_head.weight")  # Some tied checkpoints store a copy of the embedding.
  missing, unexpected = expected - found, found - expected - ignorable
  if missing:
    raise ValueError(f"The checkpoint lacks tensors {_preview(missing)} that its config.json "
                     f"implies; check that config.json belongs to these weights.")
  if unexpected:
    raise ValueError(f"The checkpoint has tensors {_preview(unexpected)} that the decoder has "
                     f"no parameter for; only plain {', '.join(model_types())} "
                     f"checkpoints are supported.")


def _read_tensors(weight_map: dict, layout: list, dtype) -> dict:
  """{HF name: our array (NumPy, in dtype)}, reading each safetensors file once."""
  by_file = collections.defaultdict(list)
  for t in layout:
    by_file[weight_map[t.name]].append((t.path, t.name, t.hf_shape, t.shape))
  arrays = {}
  for file, entries in by_file.items():
    if not pathlib.Path(file).is_file():
      raise InputError(f"The shard {file} listed in model.safetensors.index.json is "
                              f"missing; download the whole checkpoint again.")
    with _open_safetensors(file) as f:
      for path, name, hf_shape, shape in entries:
        try:
          array = f.get_tensor(name)
        except SafetensorError as e:
          raise InputError(f"tensor {name} of {file} cannot be read ({first_line(e)}): the file "
                           f"is truncated or damaged; download or export it again.") from None
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        if bad:
          raise ValueError(f"Tensor {name} in {file} has {bad} non-finite value(s) (NaN or "
                           f"inf) of {np.size(array)}: the checkpoint is damaged; download or "
                           f"export it again.")
        if tuple(array.shape) != hf_shape:
          raise ValueError(f"Tensor {name} has shape {tuple(array.shape)} but config.json "
                           f"implies {hf_shape}; check that config.json belongs to these weights.")
        arrays[name] = np.asarray(_from_hf(array, path, shape)).astype(dtype)  # our layout
  return arrays
