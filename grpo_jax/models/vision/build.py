"""model.vision: a vision-language policy (Qwen2.5-VL) for the RL loop, random from the config
or loaded from a Hugging Face folder (model.path), with the image grid and placeholder token of
its task (models/vision/policy.py).

    model.vision.depth, hidden_size, intermediate_size, num_heads, patch_size,
      temporal_patch_size, spatial_merge_size, window_size, fullatt_block_indexes
                     a random tower's Qwen2_5_VLVisionConfig fields (out_hidden_size is the
                     decoder's model.hidden_size); ignored under model.path (its config.json)
    model.vision.mrope_section   a random decoder's rope_parameters.mrope_section (sums to
                     head_dim / 2)
    model.vision.train_tower     True: the tower learns with the decoder; False: it is frozen
                     (no update, no weight decay: learner/state.py make_optimizer)

LoRA (lora.rank > 0) sits on the text decoder only, on its lora.targets projections; the
tower has no adapters, and train_tower says whether it learns in full:

                       trainable (TrainState.params)        frozen base (TrainState.base_params)
    train_tower=False  {"text": adapters}                   {"text": start, "vision": start}
    train_tower=True   {"text": adapters, "vision": tower}  {"text": start, "vision": start}

The base is the start model, so it is also the KL reference (tower included) and what a resume
rebuilds; the trained tower starts as a copy of the base's (a checkpoint holds it, the base
not). The forward merges the adapters into the decoder's kernels (models/vision/policy.py
`vlm_policy_params`: W + s A B, s = lora.alpha / rank, or / sqrt(rank) with use_rslora): at
step 0 (B = 0) the policy is the start model exactly. The merged kernel is in the base's
dtype, so with bfloat16 weights s A B is rounded to W's precision in the forward (the text
decoder adds its adapter path beside x W instead).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.hf import read_config
from grpo_jax.models.vision.qwen2_5_vl import VisionConfig
from grpo_jax.models.vision.qwen2_5_vl_model import VlmConfig, init_vlm_params

VISION_FIELDS = ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size",
                 "temporal_patch_size", "spatial_merge_size", "window_size",
                 "fullatt_block_indexes")


def _from_folder(path: str, model) -> tuple:
  """(VlmConfig, params) of a Qwen2.5-VL folder (config.json + safetensors)."""
  from safetensors.numpy import load_file  # noqa: PLC0415
  from grpo_jax.models.vision.qwen2_5_vl_model_hf import (vlm_config_from_hf,  # noqa: PLC0415
                                                          vlm_params_from_hf)
  cfg = vlm_config_from_hf(read_config(pathlib.Path(path)), model.param_dtype,
                          model.compute_dtype)
  tensors = {}
  for name in sorted(os.listdir(path)):
    if name.endswith(".safetensors"):
      tensors.update(load_file(os.path.join(path, name)))
  if not tensors:
    raise ConfigError(f"model.path={path!r} has no *.safetensors files; point it at a "
                      f"Qwen2.5-VL folder (config.json and its weights).")
  return cfg, vlm_params_from_hf(tensors, cfg, np.dtype(model.param_dtype))


def holds_vl_checkpoint(path: str) -> bool:
  """True when folder `path` has a config.json with a vision_config (a Qwen2.5-VL checkpoint);
  a folder with a tokenizer alone gives the task its tokenizer and the policy is random."""
  if not os.path.isfile(os.path.join(path, "config.json")):
    return False
  return read_config(pathlib.Path(path)).get("vision_config") is not None  # damage: a sentence


def build_vlm(model, vision: dict, key, task):
  """(VlmConfig, {"vision", "text"} params) of the model section with model.vision, fitted to
  the task's image grid and placeholder token (task.image_grid, task.image_token_id)."""
  if task is None or not hasattr(task, "image_grid"):
    raise ConfigError("model.vision is set but the task has no images; use a task with an "
                      "image per prompt (task.name='visual') or drop model.vision.")
  layout = dict(model.layout)
  if model.uses_checkpoint and holds_vl_checkpoint(model.path):
    cfg, params = _from_folder(model.path, model)
    cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, **layout))
  else:
    text = model.random
    tower = VisionConfig(**{k: (tuple(vision[k]) if k == "fullatt_block_indexes" else
                                int(vision[k])) for k in VISION_FIELDS if k in vision},
                         out_hidden_size=text.hidden_size, param_dtype=text.param_dtype,
                         compute_dtype=text.compute_dtype)
    cfg = VlmConfig(text, tower, tuple(int(v) for v in vision["mrope_section"]))
    params = None
  cfg = dataclasses.replace(cfg, image_token_id=int(task.image_token_id),
                            image_grid=tuple(task.image_grid),
                            train_tower=bool(vision.get("train_tower", True)))
  if params is None:
    params = init_vlm_params(cfg, key)
  return cfg, params


def vlm_adapters(text_adapters, params, train_tower: bool) -> dict:
  """LoRA's trainable params of a vision-language policy (see the module docstring): the
  decoder's adapters, and with train_tower a copy of the tower's params (its own buffers: the
  learner's step donates the trainable params, never the base)."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  if not train_tower:
    return {"text": text_adapters}
  return {"text": text_adapters, "vision": jax.tree.map(jnp.copy, params["vision"])}


def frozen_tower(optimizer):
  """The optimizer with the vision tower's params left as they are (model.vision.train_tower =
  False): optax.multi_transform, the tower's updates set to zero (so no weight decay either)."""
  import jax  # noqa: PLC0415
  import optax  # noqa: PLC0415

  def frozen(path) -> bool:  # a leaf under the policy's {"vision": ...}
    return any(getattr(k, "key", None) == "vision" for k in path)

  def labels(trainable):  # the policy's params, or (params, critic) as the update holds them
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "frozen" if frozen(path) else "trained", trainable)
  return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)


# What a vision-language policy does not run yet, each with the setting to change.
_REFUSED = (
    (lambda c: c.train.get("experience_source", "") not in ("", "host")
                or c.train.get("fused_steps", 0) > 0,
     "train.experience_source={v}: image prompts go through the host source; set it to 'host'",
     lambda c: c.train.experience_source or "fused"),
    (lambda c: c.rl.get("value_head", "none") == "separate",
     "rl.value_head={v}: a separate critic is a text decoder that reads no image; use "
     "rl.value_head='shared' (the head on the policy's hidden states)", lambda c: c.rl.value_head),
)


def check_vision_config(config) -> None:
  """With model.vision, one ConfigError sentence for the first setting a vision-language
  policy does not run (_REFUSED), before any compute; nothing without it."""
  if config.model.get("vision") is None:
    return
  for refused, sentence, value in _REFUSED:
    if refused(config):
      raise ConfigError("model.vision is set and " + sentence.format(v=value(config)) + ".")
