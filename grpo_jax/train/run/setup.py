"""Turning a config into the objects a run needs: the model (random, or a Hugging Face
checkpoint) and the task (from the task registry)."""

from __future__ import annotations

import dataclasses

from grpo_jax.data.task import TASKS
from grpo_jax.errors import ConfigError
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import init_params
from grpo_jax.models.lora import init_adapters, lora_scale, parse_targets


def uses_checkpoint(config) -> bool:
  return bool(config.model.path)


def build_model(config, key):
  """(ModelConfig, params): loaded from config.model.path, else random from config.model."""
  if uses_checkpoint(config):
    from grpo_jax.models.hf import load_hf_checkpoint  # transformers-free, but heavier imports
    model_cfg, params = load_hf_checkpoint(config.model.path,
                                           param_dtype=config.model.param_dtype,
                                           compute_dtype=config.model.compute_dtype)
    layout = {k: config.model[k] for k in ("remat", "logits_chunk", "attention_impl") if k in config.model}
    model_cfg = dataclasses.replace(model_cfg, **layout)
  else:
    model_cfg = ModelConfig.from_config_dict(config.model)
    params = init_params(model_cfg, key)
  if uses_lora(config):
    lo = config.lora
    model_cfg = dataclasses.replace(model_cfg, lora_scale=lora_scale(lo.rank, lo.alpha,
                                                                     lo.use_rslora))
  return model_cfg, params


def uses_lora(config) -> bool:
  lo = getattr(config, "lora", None)  # (a config without the section: full fine-tuning)
  return lo is not None and lo.rank > 0


def initial_adapters(config, base, key):
  """config.lora's adapters on `base` (B = 0: the policy starts as the base)."""
  return init_adapters(base, parse_targets(config.lora.targets), config.lora.rank, key)


def build_task(config, log=print):
  """The registered task config.task.name, built from the config."""
  import grpo_jax.builtins  # noqa: F401,PLC0415  the built-in tasks register on import
  return TASKS.get(config.task.name).build(config, log)


def check_vocabulary(model_cfg: ModelConfig, task) -> None:
  if model_cfg.vocab_size < len(task.tokenizer):
    raise ConfigError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
        f"{len(task.tokenizer)} tokens; raise model.vocab_size.")


def check_task_fits_model(config, model_cfg: ModelConfig, task) -> None:
  """What can only be checked once the task and the model are built, before any compute: the
  vocabulary, the held-out split's size against train.eval_size, and prompt + completion
  positions against the checkpoint's max_position_embeddings."""
  check_vocabulary(model_cfg, task)
  prompts = task.test_batch(config.train.eval_size).prompt_tokens
  positions = prompts.shape[1] + config.rollout.max_new_tokens
  limit = model_cfg.max_position_embeddings
  if limit and positions > limit:
    raise ConfigError(
        f"prompts of {prompts.shape[1]} tokens (data.max_prompt_tokens) + "
        f"rollout.max_new_tokens={config.rollout.max_new_tokens} = {positions} positions exceed "
        f"the model's max_position_embeddings={limit} (its config.json); lower one of them.")
