"""Turning a config into the objects a run needs: the model (random, or a Hugging Face
checkpoint) and the task (from the task registry)."""

from __future__ import annotations

from grpo_jax.data.task import TASKS
from grpo_jax.errors import ConfigError
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


def build_task(config, log=print):
  """The registered task config.task.name, built from the config."""
  import grpo_jax.builtins  # noqa: F401,PLC0415  the built-in tasks register on import
  return TASKS.get(config.task.name).build(config, log)


def check_vocabulary(model_cfg: ModelConfig, task) -> None:
  if model_cfg.vocab_size < len(task.tokenizer):
    raise ConfigError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
        f"{len(task.tokenizer)} tokens; raise model.vocab_size.")
