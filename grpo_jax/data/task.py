"""What a task is (the `Task` protocol) and the tasks by config name (task.name).

A task turns a config into prompts, and completions into rewards. The RL loop knows nothing
else of it. Register a new one with its builder and its config check:

    @register_task("my_task", capabilities=())
    class MyTask:
      @staticmethod
      def check_config(config): ...           # ConfigError sentences, before any compute
      @classmethod
      def from_config(cls, config, log): ...  # the Task

`capabilities` names what the task offers beyond the protocol (CAPABILITIES below: process
rewards, a device form for the fused loop, warm-up data, ...); registration checks the class has
their methods, and config validation checks a config asks only for what its task declared.

Built-ins: "addition" (grpo_jax.data.arithmetic), "chat_arithmetic", "table" (a researcher's
own rows and reward functions, grpo_jax.data.table) and "gsm8k" (the table task on GSM8K's rows).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.registry import Registry


@runtime_checkable
class Task(Protocol):
  """What the loop, the evaluation and the warm-up ask of a task.

  Prompt batches are dataclasses whose first two fields are `prompt_tokens` (B, P) int32,
  left-padded, and `prompt_mask` (B, P) bool, plus whatever the task needs to score them (numpy
  arrays or lists, one entry per prompt). Rows of completions are grouped by prompt: rows
  [g*G, (g+1)*G) are the G completions of prompt g.
  """
  tokenizer: Any  # encode/decode, len() = vocabulary the model must cover
  max_new_tokens: int  # completion length of evaluation (and the rollout's)
  capabilities: frozenset  # what it declared at registration (CAPABILITIES; register_task)

  @property
  def eos_id(self) -> int: ...

  @property
  def pad_id(self) -> int: ...

  def train_batch(self, position: int, count: int, seed: int):
    """Prompts [position, position + count) of the training stream of `seed`: a pure function
    of its arguments, so a run resumes (and seeds replay) without reading the stream again."""

  def test_batch(self, size: int):
    """The first `size` held-out prompts."""

  def score(self, prompts, completion_tokens, completion_mask, group_size: int) -> np.ndarray:
    """(B * G,) float32 rewards of the G completions of each prompt."""

  def eval_scores(self, prompts, completion_tokens, completion_mask) -> dict:
    """{metric name: (B,) per-prompt score} of one greedy completion per prompt; must hold
    "eval_accuracy"."""

  def prompt_texts(self, batch) -> list[str]:
    """The user's text of each prompt (without the policy's chat markup): what remote rewards,
    reward models with their own tokenizer and the samples file read."""

  def labels(self, batch) -> list[str]:
    """The gold answer of each prompt as text ("" where there is none)."""

  def decode(self, completion_tokens, completion_mask) -> list[str]:
    """The text of each completion row."""


@dataclasses.dataclass(frozen=True)
class DeviceTask:
  """A task whose data stream and reward are JAX functions, so that prompts, sampling, reward
  and update are one program (train.fused_steps). `stream(seed, count)` is host arrays of the
  stream's first `count` prompts (a table placed on the device once), `prompts(table, position,
  count)` the jittable slice [position, position + count) of it, equal to train_batch's rows;
  `rewards(prompts, tokens, mask, group_size)` and `step_rewards` (or None) as the task's
  score / step_rewards, jittable."""
  stream: Callable[[int, int], Any]
  prompts: Callable[[Any, Any, int], Any]
  rewards: Callable[..., Any]
  step_rewards: Callable[..., Any] | None = None


# What a task may offer beyond the protocol (module docstring): capability -> the methods the
# class promises, checked at registration (register_task) and against a config (config.py).
CAPABILITIES = {
    # process rewards of each completion's steps (estimators that read step_rewards): rewards
    # (B, K) float32, end_index (B, K) int32, mask (B, K) bool
    "step_rewards": ("step_rewards",),
    # the stream and the reward as JAX functions (train.fused_steps)
    "device": ("device_task",),
    # its own supervised warm-up data (warmup.steps > 0 with warmup.data_path "")
    "warmup": ("warmup_batch",),
    # tokenises {prompt, response} files (warmup.data_path, reward-model pairs from files)
    "supervised": ("supervised_example",),
    # makes reward-model preference pairs itself (rm.train_path "")
    "preference_pairs": ("train_operands",),
    # an environment's episodes (grpo_jax/data/env_task.py; train.experience_source="episodes")
    "episodes": ("train_rows", "first_messages", "prompt_ids"),
}
REQUIRED = ("check_config", "from_config", "train_batch", "test_batch", "score", "eval_scores",
            "prompt_texts", "labels", "decode", "eos_id", "pad_id")


@dataclasses.dataclass(frozen=True)
class TaskEntry:
  name: str
  cls: type
  capabilities: frozenset  # names of CAPABILITIES the class declares

  def require(self, capability: str, setting: str, fix: str) -> None:
    """A ConfigError naming `setting` and `fix` unless the task declares `capability`."""
    if capability not in self.capabilities:
      raise ConfigError(
          f"{setting} needs a task with the {capability!r} capability ("
          f"{', '.join(CAPABILITIES[capability])}), which task {self.name!r} does not declare "
          f"(it declares: {', '.join(sorted(self.capabilities)) or 'none'}); {fix}.")

  def build(self, config, log=print):
    """The task, its fields (from_config's keyword-only parameters) bound from config.task."""
    return TASKS.bind(self.name, config.task, self.cls.from_config)(config, log)


TASKS = Registry("task.name")


def register_task(name: str, capabilities=(), replace: bool = False):
  """Class decorator: registers a Task class with `check_config(config)` and
  `from_config(config, log, *, fields)` as task `name`: from_config's keyword-only parameters
  are the task's fields in config.task, with their defaults (grpo_jax/registry.py `bind`).
  `capabilities` names what it offers beyond the protocol (CAPABILITIES); a missing method of
  the protocol or of a declared capability is a TypeError here, at import."""
  capabilities = frozenset(capabilities)

  def add(cls):
    unknown = sorted(capabilities - CAPABILITIES.keys())
    if unknown:
      raise TypeError(f"task {name!r} declares unknown capabilities {unknown}; known: "
                      f"{', '.join(CAPABILITIES)}.")
    wanted = REQUIRED + tuple(m for c in sorted(capabilities) for m in CAPABILITIES[c])
    missing = [m for m in wanted if not hasattr(cls, m)]
    if missing:
      raise TypeError(f"task {name!r} ({cls.__qualname__}) lacks {', '.join(missing)}: the Task "
                      f"protocol's methods and those of its declared capabilities "
                      f"(grpo_jax/data/task.py).")
    cls.capabilities = capabilities
    TASKS.register(name, TaskEntry(name, cls, capabilities), replace=replace)
    return cls
  return add


def reward_name(config, default: str) -> str:
  """config.reward.name, or the task's default reward when it is empty or absent."""
  reward = config.get("reward")
  return (reward.name if reward is not None else "") or default


def check_eval_size(size: int, available: int, what: str,
                    fix: str = "lower train.eval_size or raise task.test_size") -> None:
  """A ConfigError when train.eval_size `size` exceeds the `available` held-out prompts."""
  if size > available:
    raise ConfigError(f"train.eval_size={size} exceeds {what}; {fix}.")


def bucketed_width(prompt_mask, bucket: int) -> int:
  """The width a batch of left-padded prompts is cut to: its longest prompt rounded up to a
  multiple of `bucket`, never wider than the batch is (bucket 0: the batch's width). So a run
  sees at most ceil(max_prompt_tokens / bucket) widths, one compiled shape each."""
  mask = np.asarray(prompt_mask)
  width = mask.shape[-1]
  if bucket <= 0:
    return width
  longest = int(mask.reshape(-1, width).sum(-1).max(initial=0))
  return min(width, max(bucket, -(-longest // bucket) * bucket))


def cut_prompts(batch, width: int):
  """A task's prompt batch with prompt_tokens / prompt_mask cut to their last `width` columns
  (left padding removed; every real token is kept, checked)."""
  mask = np.asarray(batch.prompt_mask)
  if width >= mask.shape[-1]:
    return batch
  if mask[..., :mask.shape[-1] - width].any():
    raise ValueError(f"cutting prompts to {width} columns would drop prompt tokens.")
  return dataclasses.replace(batch, prompt_tokens=np.asarray(batch.prompt_tokens)[..., -width:],
                             prompt_mask=mask[..., -width:])
