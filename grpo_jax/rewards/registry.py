"""Rewards by config name (reward.name). Two kinds, by what a reward reads:

  "tokens"  fn(completion_tokens, completion_mask, target_tokens, target_mask) -> (B,) float32,
            a JAX function of token ids: it runs on the host and inside jit, so a task whose
            reward is of this kind can run the whole RL iteration in one program
            (train.fused_steps).
  "text"    fn(completion: str, gold: str, format_score: float) -> float, on the host, on
            decoded text (e.g. GSM8K's answer extraction).

A task accepts one kind and names its default reward; a new reward is one registered function:

    @register_reward("first_token_match", kind="tokens")
    def first_token_match(tokens, mask, target_tokens, target_mask):
      return (tokens[:, 0] == target_tokens[:, 0]).astype(jnp.float32)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from grpo_jax.errors import ConfigError
from grpo_jax.registry import Registry

REWARD_KINDS = ("tokens", "text")


@dataclasses.dataclass(frozen=True)
class Reward:
  name: str
  fn: Callable
  kind: str


REWARDS = Registry("reward.name")


def register_reward(name: str, kind: str, replace: bool = False):
  """Decorator: registers fn as reward `name` of `kind` (module docstring)."""
  if kind not in REWARD_KINDS:
    raise ValueError(f"reward kind {kind!r} is unknown; valid: {', '.join(REWARD_KINDS)}.")

  def add(fn):
    REWARDS.register(name, Reward(name, fn, kind), replace=replace)
    return fn
  return add


def get_reward(name: str, kind: str, task: str) -> Reward:
  """The registered reward `name`, which must be of `kind` (what task `task` scores with)."""
  valid = ", ".join(n for n, r in REWARDS.items() if r.kind == kind)
  if name not in REWARDS:
    raise ConfigError(f"reward.name={name!r} is unknown; valid: {valid}.")
  reward = REWARDS.get(name)
  if reward.kind != kind:
    raise ConfigError(f"reward.name={name!r} is a {reward.kind} reward but task {task!r} scores "
                      f"with {kind} rewards; valid: {valid}.")
  return reward
