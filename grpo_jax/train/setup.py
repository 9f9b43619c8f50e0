"""Turning a config into the objects a run needs: the model (random, or a Hugging Face
checkpoint) and the task."""

from __future__ import annotations

import os

import jax

from grpo_jax import config as config_lib
from grpo_jax.data.arithmetic import AdditionTask
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import init_params


def uses_checkpoint(config) -> bool:
  return bool(config.model.get("path", ""))


def build_model(config, key):
  """(ModelConfig, params): loaded from config.model.path, else random from config.model."""
  if uses_checkpoint(config):
    from grpo_jax.models.hf import load_hf_checkpoint  # transformers-free, but heavier imports
    return load_hf_checkpoint(config.model.path, param_dtype=config.model.param_dtype,
                              compute_dtype=config.model.compute_dtype)
  model_cfg = ModelConfig.from_config_dict(config.model)
  return model_cfg, init_params(model_cfg, key)


def load_tokenizer(path: str):
  """The checkpoint's own tokenizer (and chat template), from local files only."""
  if not os.path.isdir(path):
    raise config_lib.ConfigError(
        f"model.path={path} is not a directory; download a checkpoint first, e.g. "
        f"hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir {path}.")
  from transformers import AutoTokenizer
  try:
    return AutoTokenizer.from_pretrained(path, local_files_only=True)
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(
        f"no tokenizer could be loaded from model.path={path} ({str(e).splitlines()[0]}); the "
        f"folder needs the checkpoint's tokenizer files (tokenizer.json, "
        f"tokenizer_config.json).") from None


def build_task(config, log=print):
  t = config.task
  if t.name == "addition":
    return AdditionTask(t.num_digits, t.test_size, config.rollout.max_new_tokens, t.fixed_width,
                        t.reverse_answer)
  if t.name == "gsm8k":
    from grpo_jax.data.gsm8k import GSM8KTask
    return GSM8KTask(config.data, config.reward, load_tokenizer(config.model.path),
                     config.data.max_prompt_tokens, config.rollout.max_new_tokens, log)
  raise config_lib.ConfigError(f"task.name={t.name!r} is unknown; valid: "
                               f"{', '.join(config_lib.TASKS)}.")
