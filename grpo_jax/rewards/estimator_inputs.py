"""Per-row estimator inputs by name: what an advantage estimator `needs` besides the rewards
(grpo_jax/rl/estimators.py; it reads them from `x.extras`). Each input is made by one
registered provider with a host form (NumPy, from one scored sampling round: the "host"
experience source, train/sources/collect.py) and, optionally, a device form (jnp, inside the "fused"
experience source's program, train/sources/fused.py). Only the inputs the configured estimator needs
are made. An estimator that needs a new input is its own file with the provider beside it:

    @register_input("first_token", device=lambda r: r.tokens[:, 0].astype(jnp.float32))
    def first_token(r: HostRound) -> Provided:
      return Provided(np.asarray(r.rollout.completion_tokens)[:, 0].astype(np.float32))

    @register_estimator("my_estimator", needs=("first_token",))
    def my_estimator(x): ... x.extras["first_token"] ...

Built in: "greedy_rewards" (ReMax's baseline: the reward of each row's prompt's greedy
completion) and "step_rewards" (process rewards: the task's, or reward.process_model's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from grpo_jax.errors import RewardError
from grpo_jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class HostRound:
  """One sampling round of the host source, scored: what a host provider reads."""
  task: Any  # the run's Task
  prompts: Any  # the round's PromptBatch (num_prompts rows)
  rollout: Any  # Rollout of B = num_prompts x G rows, groups contiguous
  group_size: int
  on_reward_error: str  # train.on_reward_error: "raise" or "zero"
  sources: Any  # RewardSources (the rewards and how they combine; .score, .process_model)
  rewards: np.ndarray  # (B,) the round's rewards (0 where failed)
  failed: np.ndarray  # (B,) bool: rows scored 0 because a reward raised or was not finite
  greedy: Any = None  # Rollout of one greedy row per prompt (providers with uses_greedy)


@dataclasses.dataclass(frozen=True)
class Provided:
  """A host provider's answer: the input (an array of B rows, or a tuple of them) and what it
  found wrong: rows it marks failed (their rewards become 0), errors counted, and completions
  it scored besides the round's (e.g. greedy ones; the `scored` count)."""
  value: Any
  failed: Optional[np.ndarray] = None
  errors: int = 0
  scored: int = 0


@dataclasses.dataclass(frozen=True)
class DeviceRound:
  """The fused source's round, on the devices: what a device provider reads."""
  task: Any  # the task's DeviceTask (rewards, step_rewards, ... as JAX functions)
  prompts: Any  # the round's prompts (DevicePrompts)
  tokens: Any  # (B, N) completion tokens
  mask: Any  # (B, N) bool
  group_size: int
  greedy: Callable[[], Any]  # () -> Rollout of one greedy row per prompt (traced on demand)


@dataclasses.dataclass(frozen=True)
class InputProvider:
  host: Callable[[HostRound], Provided]
  device: Optional[Callable[[DeviceRound], Any]] = None  # None: the fused source refuses it
  uses_greedy: bool = False  # the host round must carry one greedy completion per prompt
  # (config, task entry) -> None, or why this run cannot make the input (config validation).
  unavailable: Callable[[Any, Any], Optional[str]] = lambda config, task: None


INPUTS = Registry("estimator input")


def register_input(name: str, *, device=None, uses_greedy: bool = False, unavailable=None,
                   replace: bool = False):
  """Decorator: registers host(HostRound) -> Provided as the provider of input `name`."""
  def add(host):
    INPUTS.register(name, InputProvider(host, device, uses_greedy,
                                        unavailable or (lambda config, task: None)),
                    replace=replace)
    return host
  return add


def provide_host(needs, round_: HostRound) -> tuple[dict, np.ndarray, np.ndarray, int, int]:
  """The inputs `needs` names for one host round, in order: (extras, rewards, failed, errors,
  scored), rewards and failed updated with the rows the providers marked failed."""
  extras, errors, scored = {}, 0, 0
  for name in needs:
    got = INPUTS.get(name).host(round_)
    extras[name] = got.value
    errors, scored = errors + got.errors, scored + got.scored
    if got.failed is not None:
      failed = round_.failed | got.failed
      rewards = np.where(failed, 0.0, round_.rewards).astype(np.float32)
      round_ = dataclasses.replace(round_, failed=failed, rewards=rewards)
  return extras, round_.rewards, round_.failed, errors, scored


def provide_device(needs, round_: DeviceRound) -> dict:
  """The inputs `needs` names, made on the devices (each provider's device form)."""
  return {name: INPUTS.get(name).device(round_) for name in needs}


def step_needs(config) -> tuple:
  """The per-row inputs a run's step reads: its estimator's `needs`, and "teacher_logprobs" when
  it distils (rl.distill_coef > 0, grpo_jax/rl/distill.py)."""
  from grpo_jax.rl.estimators import ESTIMATORS  # noqa: PLC0415
  needs = ESTIMATORS.get(config.rl.advantage).needs
  return needs + ("teacher_logprobs",) if config.rl.get("distill_coef", 0) > 0 else needs


def uses_greedy(needs) -> bool:
  """Whether any needed input reads a greedy completion per prompt."""
  return any(INPUTS.get(name).uses_greedy for name in needs)


def check_inputs(needs, config, task, estimator_name: str, device: bool) -> Optional[str]:
  """None, or one sentence saying which input of `needs` this run cannot make and why."""
  for name in needs:
    if name not in INPUTS:
      return (f"rl.advantage={estimator_name!r} needs {name}, which no provider makes; "
              f"register one with grpo_jax.rewards.estimator_inputs.register_input (known: "
              f"{', '.join(INPUTS.names())}).")
    provider = INPUTS.get(name)
    why = provider.unavailable(config, task)
    if why:
      return f"rl.advantage={estimator_name!r} needs {name}, {why}"
    if device and provider.device is None:
      return (f"rl.advantage={estimator_name!r} needs {name}, which has no device form; the "
              f"fused experience source cannot make it (use the host source).")
  return None


# --- built-in inputs ------------------------------------------------------------------------

def _device_greedy_rewards(r: DeviceRound):
  import jax.numpy as jnp  # noqa: PLC0415
  best = r.greedy()
  rewards = r.task.rewards(r.prompts, best.completion_tokens, best.completion_mask, 1)
  return jnp.repeat(rewards, r.group_size, axis=0)


def _no_greedy_normalisation(config, task) -> Optional[str]:
  del task
  reward = config.get("reward")
  if reward is None or reward.get("combine", "sum") != "normalise_then_sum":
    return None
  return ("which reward.combine='normalise_then_sum' cannot score: each prompt's greedy "
          "completion is a group of one, with no group standard deviation to normalise its "
          "rewards by; set reward.combine='sum'.")


@register_input("greedy_rewards", uses_greedy=True, device=_device_greedy_rewards,
                unavailable=_no_greedy_normalisation)
def greedy_rewards(r: HostRound) -> Provided:
  """(B,) the reward of the greedy completion of each row's prompt (ReMax's baseline)."""
  rewards, bad, _ = r.sources.score(r.task, r.prompts, r.greedy.completion_tokens,
                                    r.greedy.completion_mask, 1, r.on_reward_error)
  return Provided(np.repeat(rewards, r.group_size), errors=int(bad.sum()),
                  scored=len(rewards))


def _no_step_rewards(config, task) -> Optional[str]:
  from grpo_jax.rewards.sources import uses_process_model  # noqa: PLC0415
  if "step_rewards" in task.capabilities or uses_process_model(config):
    return None
  return (f"which task {task.name!r} does not provide; pick another estimator or set "
          f"reward.process_model.")


@register_input("step_rewards", unavailable=_no_step_rewards,
                device=lambda r: r.task.step_rewards(r.prompts, r.tokens, r.mask, r.group_size))
def step_rewards(r: HostRound) -> Provided:
  """(rewards (B, K), end_index (B, K) int, mask (B, K) bool): process rewards, from
  reward.process_model when set, else the task's `step_rewards`. A completion scored 0 for a
  failing reward scores 0 on every step; non-finite step rewards fail their row."""
  tokens, mask = r.rollout.completion_tokens, r.rollout.completion_mask
  if r.sources.process_model is not None:
    rewards, end_index, step_mask = r.sources.process_model.step_rewards(
        r.prompts, np.asarray(tokens), np.asarray(mask), r.group_size)
  else:
    rewards, end_index, step_mask = r.task.step_rewards(r.prompts, tokens, mask, r.group_size)
  bad = ~np.all(np.isfinite(np.asarray(rewards, np.float64)), axis=1) & ~r.failed
  if bad.any() and r.on_reward_error == "raise":
    raise RewardError(f"the task's step rewards are not finite for {int(bad.sum())} "
                      f"completion(s) (e.g. row {int(np.argmax(bad))}); fix step_rewards, or "
                      f"set train.on_reward_error='zero' to score such completions 0 and count "
                      f"them.")
  failed = r.failed | bad
  value = (np.where(failed[:, None], 0.0, rewards).astype(np.float32), end_index, step_mask)
  return Provided(value, failed=bad if bad.any() else None, errors=int(bad.sum()))


@register_input("teacher_logprobs")
def teacher_logprobs(r: HostRound) -> Provided:
  """(B, N) the distillation teacher's log-probs of the sampled tokens, 0 outside the
  completions (rl.distill_teacher; grpo_jax/rl/distill.py). Non-finite values fail their row."""
  tokens, mask = np.asarray(r.rollout.completion_tokens), np.asarray(r.rollout.completion_mask)
  values = np.asarray(r.sources.teacher.logprobs(r.prompts, tokens, mask, r.group_size),
                      np.float32)
  bad = ~np.all(np.isfinite(values), axis=1) & ~r.failed
  if bad.any() and r.on_reward_error == "raise":
    raise RewardError(f"the distillation teacher's log-probs are not finite for "
                      f"{int(bad.sum())} completion(s) (e.g. row {int(np.argmax(bad))}); check "
                      f"rl.distill_teacher's weights, or set train.on_reward_error='zero'.")
  return Provided(np.where(np.isfinite(values), values, 0.0), failed=bad, errors=int(bad.sum()))
