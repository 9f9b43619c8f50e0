"""The objects a run needs: the model (random, or a Hugging Face checkpoint) from its
ModelSection, and the task (from the task registry, which builds from the whole config)."""

from __future__ import annotations

import dataclasses

from grpo_jax.data.task import TASKS
from grpo_jax.errors import ConfigError
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import init_params
from grpo_jax.models.lora import init_adapters, lora_scale, parse_targets
from grpo_jax.train.run.sections import LoraSection, ModelSection


def build_model(model: ModelSection, key, task=None):
  """(ModelConfig, params): loaded from model.path, else random from the model section; with
  model.vision, (VlmConfig, {"vision", "text"} params) for the image + text `task`."""
  if model.vision is not None:
    from grpo_jax.models.vision.build import build_vlm  # noqa: PLC0415
    vlm_cfg, params = build_vlm(model, dict(model.vision), key, task)
    if model.lora is not None:  # the adapters sit on the decoder (models/vision/build.py)
      vlm_cfg = dataclasses.replace(vlm_cfg, text=with_lora_scale(vlm_cfg.text, model.lora))
    return vlm_cfg, params
  if model.uses_checkpoint:
    from grpo_jax.models.hf import load_hf_checkpoint  # transformers-free, but heavier imports
    model_cfg, params = load_hf_checkpoint(model.path, param_dtype=model.param_dtype,
                                           compute_dtype=model.compute_dtype)
    model_cfg = dataclasses.replace(model_cfg, **dict(model.layout))
  else:
    model_cfg = model.random
    params = init_params(model_cfg, key)
  if model.lora is not None:
    model_cfg = with_lora_scale(model_cfg, model.lora)
  return model_cfg, params


def with_lora_scale(model_cfg: ModelConfig, lo: LoraSection) -> ModelConfig:
  """model_cfg with lora_scale = lora.alpha / rank (or / sqrt(rank) with use_rslora)."""
  return dataclasses.replace(model_cfg, lora_scale=lora_scale(lo.rank, lo.alpha, lo.use_rslora))


def initial_adapters(lora: LoraSection, base, key, model_cfg=None):
  """The LoRA section's adapters on `base` (B = 0: the policy starts as the base); for a
  vision-language model_cfg, on base["text"] with the tower's params when it trains
  (models/vision/build.py `vlm_adapters`)."""
  if getattr(model_cfg, "vision", None) is not None:
    from grpo_jax.models.vision.build import vlm_adapters  # noqa: PLC0415
    return vlm_adapters(initial_adapters(lora, base["text"], key), base,
                        model_cfg.train_tower)
  return init_adapters(base, parse_targets(lora.targets), lora.rank, key)


def build_task(config, log=print):
  """The registered task config.task.name, built from the config."""
  import grpo_jax.builtins  # noqa: F401,PLC0415  the built-in tasks register on import
  return TASKS.get(config.task.name).build(config, log)


def check_task_fits_model(model_cfg: ModelConfig, task, eval_size: int,
                          max_new_tokens: int) -> None:
  """What can only be checked once the task and the model are built, before any compute: the
  vocabulary, the held-out split's size against train.eval_size, and prompt + completion
  positions against the checkpoint's max_position_embeddings."""
  if model_cfg.vocab_size < len(task.tokenizer):
    raise ConfigError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
        f"{len(task.tokenizer)} tokens; raise model.vocab_size.")
  prompts = task.test_batch(eval_size).prompt_tokens
  positions = prompts.shape[1] + max_new_tokens
  limit = model_cfg.max_position_embeddings
  if limit and positions > limit:
    raise ConfigError(
        f"prompts of {prompts.shape[1]} tokens (data.max_prompt_tokens) + "
        f"rollout.max_new_tokens={max_new_tokens} = {positions} positions exceed "
        f"the model's max_position_embeddings={limit} (its config.json); lower one of them.")
