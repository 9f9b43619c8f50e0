"""Outcome reward models: our decoder plus a score head, as transformers'
`*ForSequenceClassification` (Llama, Qwen2, Qwen3, ... every registered family).

Params are a plain pytree ``{"backbone": decoder params (no vocabulary head), "score":
{"kernel": (H, num_labels)}}``. The score is read at the last real token of each row:

    r(x) = h_L(x)[last] @ W_score        (no bias, as transformers' `score` Linear)

where h_L is the final RMS-normed hidden state and `last` the rightmost position whose mask is
1. transformers finds that position as the rightmost token != pad_token_id; the two agree
unless a real token equals the pad id (then ours, which reads the mask, is the right one).

Checkpoint names are transformers': ``model.embed_tokens.weight``, ``model.layers.N...``,
``model.norm.weight``, ``score.weight`` (num_labels, H). A causal LM's folder also loads (its
``lm_head`` is dropped, the score head starts at zero): the usual start of reward-model
training from an SFT policy (OpenRLHF, TRL).
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import decoder_apply, init_params, positions_from_mask
from grpo_jax.models.hf import (_open_safetensors, _read_tensors, _weight_map,
                                hf_config_from_model_config, loading_errors,
                                model_config_from_hf, param_layout, params_from_hf, read_config)
from grpo_jax.models.hf_export import _hf_tensors, export_dtype, write_folder


# The score head's logical axes (grpo_jax/models/partitioning.py), as a value head's.
SCORE_AXES = {("score", "kernel"): ("embed", "value")}


def backbone_config(model_cfg: ModelConfig) -> ModelConfig:
  """The decoder config of a reward model's backbone: no vocabulary head of its own (a
  classification model has none), so the tie flag only says there is no lm_head param."""
  return dataclasses.replace(model_cfg, tie_embeddings=True)


def init_reward_model(model_cfg: ModelConfig, key, num_labels: int = 1, backbone=None):
  """A reward model on `backbone` (e.g. an SFT policy's params; its lm_head is dropped) or on
  random params of model_cfg; the score head starts at zero (every score 0)."""
  if backbone is None:
    backbone = init_params(backbone_config(model_cfg), key)
  backbone = {k: v for k, v in backbone.items() if k != "lm_head"}
  return {"backbone": backbone,
          "score": {"kernel": jnp.zeros((model_cfg.hidden_size, num_labels), jnp.float32)}}


def last_token_index(mask) -> jax.Array:
  """(B,) the rightmost position where mask is true (0 for an all-false row)."""
  mask = jnp.asarray(mask).astype(bool)
  return jnp.argmax(jnp.where(mask, jnp.arange(mask.shape[1]), -1), axis=1)


def reward_scores(params, model_cfg: ModelConfig, tokens, mask) -> jax.Array:
  """(B, num_labels) float32 scores of padded rows `tokens` (B, T) with `mask` (B, T) (left,
  right or both sides padded): the formula of the module docstring."""
  mask = jnp.asarray(mask).astype(bool)
  cfg = backbone_config(model_cfg)
  hidden, _ = decoder_apply(cfg, params["backbone"], tokens, positions_from_mask(mask), mask,
                            None, 0, project=False)
  last = hidden[jnp.arange(hidden.shape[0]), last_token_index(mask)]
  kernel = params["score"]["kernel"]
  return jnp.dot(last.astype(cfg.dtype), kernel.astype(cfg.dtype)).astype(jnp.float32)


def sequence_reward(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                    completion_tokens, completion_mask) -> jax.Array:
  """(B,) the first label's score of [prompt | completion] (same tokenizer as the policy)."""
  tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
  mask = jnp.concatenate([prompt_mask, completion_mask], axis=1)
  return reward_scores(params, model_cfg, tokens, mask)[:, 0]


# ----------------------------------------------------------------------------- HF folders


def load_reward_model(path, param_dtype: str = "float32", compute_dtype: str = "float32"):
  """(ModelConfig, params, num_labels) of a local `*ForSequenceClassification` folder (or of a
  causal LM's: score head zero, num_labels 1)."""
  path = pathlib.Path(path)
  with loading_errors(f"reward model {path}"):
    hf_config = read_config(path)
    model_cfg = model_config_from_hf(hf_config, param_dtype, compute_dtype)
    weight_map = _weight_map(path)
    layout, treedef = param_layout(backbone_config(model_cfg))
    missing = sorted({t.name for t in layout} - set(weight_map))
    if missing:
      raise ValueError(f"the checkpoint lacks tensors {', '.join(missing[:3])} that its "
                       f"config.json implies; check that config.json belongs to these weights")
    arrays = _read_tensors(weight_map, layout, jnp.dtype(param_dtype))
    backbone = params_from_hf(layout, treedef, arrays, jnp.dtype(param_dtype))
    if "score.weight" in weight_map:
      with _open_safetensors(weight_map["score.weight"]) as f:
        score = np.asarray(f.get_tensor("score.weight"), np.float32)
      if score.ndim != 2 or score.shape[1] != model_cfg.hidden_size:
        raise ValueError(f"score.weight has shape {score.shape}, not (num_labels, "
                         f"hidden_size={model_cfg.hidden_size})")
      kernel = jnp.asarray(score.T)
    else:  # a causal LM: the start of reward-model training
      kernel = jnp.zeros((model_cfg.hidden_size, 1), jnp.float32)
  return model_cfg, {"backbone": backbone, "score": {"kernel": kernel}}, int(kernel.shape[1])


def export_reward_model(params, model_cfg: ModelConfig, out_dir, model_type: str = "qwen2",
                        pad_token_id: int = 0, dtype: str = "float32",
                        tokenizer_dir=None, max_shard_bytes: int = 0) -> pathlib.Path:
  """Writes a `*ForSequenceClassification` folder that transformers loads with
  AutoModelForSequenceClassification (and load_reward_model reads back): its tensors in
  `dtype`, in shards of at most max_shard_bytes when > 0 (hf_export.save_shards)."""
  np_dtype = export_dtype(dtype)
  tensors = _hf_tensors(params["backbone"], backbone_config(model_cfg), np_dtype)
  kernel = np.asarray(params["score"]["kernel"], np.float32)
  tensors["score.weight"] = np.ascontiguousarray(kernel.T).astype(np_dtype)
  hf_config = hf_config_from_model_config(model_cfg, model_type, dtype)
  arch = hf_config["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")
  labels = range(kernel.shape[1])
  hf_config.update(architectures=[arch], num_labels=len(labels),
                   id2label={str(i): f"LABEL_{i}" for i in labels},
                   label2id={f"LABEL_{i}": i for i in labels}, pad_token_id=int(pad_token_id))
  return write_folder(tensors, hf_config, out_dir, max_shard_bytes, source_dir=tokenizer_dir)
