"""Arithmetic questions put to a real chat model, answered with just the number: the real-model
recipe's task (configs/grpo_smollm2.py; docs/real_models.md#smollm2-135m-instruct-on-a-cpu).

A prompt is the tokenizer's chat template around one user message, "What is 47 + 51? " followed
by `data.instruction` (the recipe: "Answer with a single number."). Operands are integers in
[0, task.max_operand); `task.operations` picks among "+", "-" (a >= b, so answers are never
negative) and "*". The held-out split is `task.test_size` problems drawn once with a fixed seed
(never trained on); the training stream is the rest, reshuffled every epoch by (seed, epoch).
Everything is a pure function of the config, the seed and the stream position: no files.

Why this task (docs/real_models.md#the-task): SmolLM2-135M-Instruct computes such sums right
about a quarter of the time but never in the requested format (greedy: "47 + 51 = 108"), so
held-out exact match starts at 0 and RL has both a format and a correctness to move; answers
are a few tokens, so a GRPO step fits a 2-core CPU. Scoring is on the decoded text
(rewards/number_answer.py): held-out accuracy is exact match of the answer (the completion's
last integer equals the gold one); format compliance (the bare number and nothing else) and
strict accuracy (both) are reported beside it.
"""

from __future__ import annotations

import operator
import os

import numpy as np

from grpo_jax.data.chat import ChatPrompts, ChatTextTask, epoch_stream
from grpo_jax.data.task import check_eval_size, register_task, reward_name
from grpo_jax.errors import ConfigError, require as _require
from grpo_jax.rewards.number_answer import answer_scores
from grpo_jax.rewards.registry import get_reward

_SPLIT_SEED = 4321  # fixed: the held-out split must not move with the experiment's seed
OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
DEFAULT_REWARD = "number_shaped"


def all_problems(max_operand: int, operations: str) -> list[tuple[int, str, int]]:
  """Every (a, op, b) with operands in [0, max_operand), a >= b for "-", in a fixed order."""
  return [(a, op, b) for op in operations for a in range(max_operand)
          for b in range(max_operand) if op != "-" or a >= b]


@register_task("chat_arithmetic")
class ChatArithmeticTask(ChatTextTask):
  """Procedural arithmetic in a Hugging Face chat model's template, scored on decoded text
  ("text" rewards, number_shaped by default; held-out exact match, correctness and format)."""

  @staticmethod
  def check_config(config) -> None:
    task, path = config.task, config.model.path
    _require(bool(path) and os.path.isdir(path), f"task.name='chat_arithmetic' needs model.path, "
             f"a Hugging Face checkpoint folder with a tokenizer, but model.path={path!r} is not "
             f"a folder; fetch the real model with python -m grpo_jax.fetch_model "
             f"smollm2-135m-instruct (its default folder is the recipe's model.path), or pass "
             f"--config.model.path=<a checkpoint folder>.")
    ops = task.operations
    _require(bool(ops) and all(o in OPERATIONS for o in ops) and len(set(ops)) == len(ops),
             f"task.operations={ops!r}; use one or more of {''.join(OPERATIONS)}, each once "
             f"(e.g. '+-').")
    top = task.max_operand
    _require(isinstance(top, int) and top >= 2, f"task.max_operand={top!r}; use an integer "
             f">= 2 (operands are drawn from [0, max_operand)).")
    total = len(all_problems(top, ops))
    _require(0 < task.test_size < total, f"task.test_size={task.test_size} must be in (0, "
             f"{total}) for task.max_operand={top} and task.operations={ops!r}; lower it.")
    get_reward(reward_name(config, DEFAULT_REWARD), "text", "chat_arithmetic")

  @classmethod
  def from_config(cls, config, log=print, *, max_operand=100, operations="+",
                  test_size=500) -> "ChatArithmeticTask":
    """The task's fields (task.*): operands in [0, max_operand), any of "+", "-", "*", and
    test_size held-out problems."""
    from grpo_jax.data.tokenizer import load_hf_tokenizer  # noqa: PLC0415  transformers
    return cls(load_hf_tokenizer(config.model.path), max_operand,
               operations, test_size, config.data.instruction,
               config.data.use_chat_template, config.data.max_prompt_tokens,
               config.rollout.max_new_tokens, reward_name(config, DEFAULT_REWARD),
               config.reward.format_score)

  def __init__(self, tokenizer, max_operand: int, operations: str, test_size: int,
               instruction: str, use_chat_template: bool, max_prompt_tokens: int,
               max_new_tokens: int, reward: str = DEFAULT_REWARD, format_score: float = 0.0):
    self.tokenizer = tokenizer
    self.instruction = instruction
    self.use_chat_template = use_chat_template
    self.prompt_len = max_prompt_tokens
    self.max_new_tokens = max_new_tokens
    self.reward_fn = get_reward(reward, "text", "chat_arithmetic").fn
    self.format_score = format_score
    problems = all_problems(max_operand, operations)
    order = np.random.default_rng(_SPLIT_SEED).permutation(len(problems))
    self.test = [self._encode(problems[i]) for i in order[:test_size]]
    self.train = [problems[i] for i in order[test_size:]]  # encoded when drawn
    # every prompt the task can put, training ones included (a longer one would fail mid-run)
    longest = max([len(item[0]) for item in self.test]
                  + [len(self._encode(problem)[0]) for problem in self.train])
    if longest > self.prompt_len:
      raise ConfigError(f"a chat_arithmetic prompt takes {longest} tokens, more than "
                        f"data.max_prompt_tokens={self.prompt_len}; raise it.")

  def _encode(self, problem) -> tuple[list, str, str]:
    a, op, b = problem
    user = f"What is {a} {op} {b}? {self.instruction}".strip()
    ids = self.tokenizer(self.chat_prompt(user), add_special_tokens=False)["input_ids"]
    return ids, str(OPERATIONS[op](a, b)), user

  def train_batch(self, position: int, count: int, seed: int) -> ChatPrompts:
    return self._batch([self._encode(self.train[i])
                        for i in epoch_stream(len(self.train), position, count, seed)])

  def test_batch(self, size: int) -> ChatPrompts:
    check_eval_size(size, len(self.test),
                    f"the {len(self.test)} held-out problems (task.test_size)")
    return self._batch(self.test[:size])

  def score(self, batch: ChatPrompts, completion_tokens, completion_mask,
            group_size: int) -> np.ndarray:
    """(B * G,) float32 rewards of the configured text reward."""
    texts = self.decode(completion_tokens, completion_mask)
    golds = np.repeat(np.asarray(batch.gold, dtype=object), group_size)
    return np.array([self.reward_fn(t, g, self.format_score) for t, g in zip(texts, golds)],
                    np.float32)

  def eval_scores(self, batch: ChatPrompts, completion_tokens, completion_mask) -> dict:
    """Per prompt (answer_scores): eval_accuracy, the answer (the completion's last integer)
    matches the gold exactly; eval_format, the completion is the bare number asked for;
    eval_strict, both."""
    texts = self.decode(completion_tokens, completion_mask)
    scores = [answer_scores(t, g) for t, g in zip(texts, batch.gold)]
    return {"eval_accuracy": np.array([s.correct for s in scores], np.float32),
            "eval_format": np.array([s.format for s in scores], np.float32),
            "eval_strict": np.array([s.exact for s in scores], np.float32)}
