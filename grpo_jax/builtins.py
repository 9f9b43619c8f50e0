"""Imports every module that registers a built-in entry (estimators, policy losses, KL
estimators, rewards, tasks, model families), so that the registries are full before a config
is validated. A researcher's own entries come from config.imports (grpo_jax.registry)."""

from grpo_jax.data import addition_work, arithmetic, chat_arithmetic, gsm8k, table  # noqa: F401
from grpo_jax.data import env_task  # noqa: F401  episodes (task.name="env")
from grpo_jax.data import visual_task  # noqa: F401  image + text prompts (task.name="visual")
from grpo_jax.envs import calculator  # noqa: F401  the built-in environment
from grpo_jax.envs.adapters import openenv  # noqa: F401  env.name="openenv" (lazy import)
from grpo_jax.models import families  # noqa: F401  model families
from grpo_jax.rewards import exact_match, number_answer  # noqa: F401  token, text rewards
from grpo_jax.rewards import gsm8k as gsm8k_rewards  # noqa: F401  text rewards
from grpo_jax.rl import drpo, estimators, kl, losses, online_dpo  # noqa: F401  objectives, advantages, KL, losses
