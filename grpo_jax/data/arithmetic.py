"""Procedural addition: prompts "<bos>57+68=", answers "125<eos>" (or, with
fixed_width, "<bos>07+68=" and "075<eos>": operands zero-padded to num_digits and the sum to
num_digits + 1 digits, which small models learn much faster because every digit sits at a fixed
position). With reverse_answer the sum is written least-significant digit first ("570" for
075), the order in which carries are computed: small transformers learn that format far
faster (Lee et al. 2023, "Teaching Arithmetic to Small Transformers").

Operands are integers in [0, 10^num_digits). The held-out test split is a fixed set of
*unordered* pairs {a, b}, so neither a+b nor b+a of a test problem is ever trained on.
Everything is a pure function of (config, seed, position): no files, no downloads.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.data.chat import epoch_stream
from grpo_jax.data.task import DeviceTask, check_eval_size, register_task, reward_name
from grpo_jax.data.tokenizer import CharTask, CharTokenizer, pad_rows
from grpo_jax.errors import ConfigError
from grpo_jax.rewards.exact_match import token_step_rewards
from grpo_jax.rewards.registry import get_reward

_SPLIT_SEED = 1234  # fixed: the split must not move with the experiment's seed


def drop_carries(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """The classic mistake: each digit is (a_i + b_i) mod 10, carries forgotten (57+68 -> 15)."""
  out = np.zeros_like(a)
  scale = 1
  a, b = a.copy(), b.copy()
  while np.any((a > 0) | (b > 0)):
    out += ((a % 10 + b % 10) % 10) * scale
    a //= 10
    b //= 10
    scale *= 10
  return out


@dataclasses.dataclass
class PromptBatch:
  prompt_tokens: np.ndarray  # (B, P) int32, left-padded
  prompt_mask: np.ndarray  # (B, P) bool
  target_tokens: np.ndarray  # (B, N) int32: answer digits then <eos>, pad after
  target_mask: np.ndarray  # (B, N) bool
  operands: np.ndarray  # (B, 2) int64


def check_digits(num_digits) -> None:
  """task.num_digits in 1..4: the task lists every unordered pair of operands, 10^(2n) / 2 of
  them (5 digits: 5e9 pairs, 9.3 GiB for their indices alone, then a MemoryError)."""
  if not (isinstance(num_digits, int) and 1 <= num_digits <= 4):
    raise ConfigError(f"task.num_digits={num_digits!r}; use 1 to 4 (the task lists every pair "
                      f"of operands: 10^(2n) / 2 of them).")


@register_task("addition", capabilities=("step_rewards", "device", "warmup", "supervised",
                                           "preference_pairs"))
class AdditionTask(CharTask):
  """Train/test problems, tokenisation, and the data stream for RL and warm-up. Rewards are
  "tokens" rewards (grpo_jax.rewards.registry) against the answer's tokens, exact_match by
  default, so the task also runs fused (`device_task`)."""

  def __init__(self, num_digits: int, test_size: int, max_new_tokens: int,
               fixed_width: bool = False, reverse_answer: bool = False,
               reward: str = "exact_match"):
    self.reward = get_reward(reward, "tokens", "addition")
    check_digits(num_digits)
    self.num_digits = num_digits
    self.fixed_width = fixed_width
    self.reverse_answer = reverse_answer
    self.tokenizer = CharTokenizer("0123456789+=")
    self.prompt_len = 1 + 2 * num_digits + 2
    self.answer_len = num_digits + 2  # digits of a sum of two d-digit numbers, plus <eos>
    if max_new_tokens < self.answer_len:
      raise ConfigError(f"rollout.max_new_tokens={max_new_tokens} is shorter than the longest "
                       f"answer of {num_digits}-digit addition ({self.answer_len} tokens with "
                       f"<eos>); set it to at least {self.answer_len}.")
    self.max_new_tokens = max_new_tokens
    n = 10 ** num_digits
    a, b = np.triu_indices(n)  # unordered pairs a <= b
    num_pairs = len(a)
    if not 0 < test_size < num_pairs:
      raise ConfigError(f"task.test_size={test_size} must be in (0, {num_pairs}) for "
                       f"{num_digits}-digit operands.")
    order = np.random.default_rng(_SPLIT_SEED).permutation(num_pairs)
    test_idx, train_idx = order[:test_size], order[test_size:]
    self.test_pairs = np.stack([a[test_idx], b[test_idx]], 1)
    train = np.stack([a[train_idx], b[train_idx]], 1)
    swapped = train[train[:, 0] != train[:, 1]][:, ::-1]
    self.train_pairs = np.concatenate([train, swapped], 0)  # both orders of each train pair

  def encode(self, operands: np.ndarray, answers: np.ndarray | None = None) -> PromptBatch:
    tok = self.tokenizer
    answers = operands.sum(1) if answers is None else answers
    d = self.num_digits if self.fixed_width else 0
    prompts = [tok.encode(f"{x:0{d}d}+{y:0{d}d}=", bos=True) for x, y in operands]
    texts = [f"{s:0{d + 1 if d else 0}d}" for s in answers]
    targets = [tok.encode(t[::-1] if self.reverse_answer else t, eos=True) for t in texts]
    pt, pm = pad_rows(prompts, self.prompt_len, tok.pad_id, left=True)
    tt, tm = pad_rows(targets, self.max_new_tokens, tok.pad_id, left=False)
    return PromptBatch(pt, pm, tt, tm, operands)

  def train_operands(self, position: int, count: int, seed: int) -> np.ndarray:
    """Problems [position, position + count) of the training stream (chat.epoch_stream)."""
    return self.train_pairs[np.asarray(epoch_stream(len(self.train_pairs), position, count,
                                                    seed))]

  def train_batch(self, position: int, count: int, seed: int) -> PromptBatch:
    return self.encode(self.train_operands(position, count, seed))

  def test_batch(self, size: int) -> PromptBatch:
    check_eval_size(size, len(self.test_pairs), f"the {len(self.test_pairs)} test problems")
    return self.encode(self.test_pairs[:size])

  def warmup_batch(self, step: int, count: int, seed: int,
                   carry_drop_fraction: float) -> PromptBatch:
    """Supervised warm-up data: training problems whose answer has its carries dropped with
    probability `carry_drop_fraction`, so the warmed-up policy is only partly right."""
    operands = self.train_operands(step * count, count, seed + 1)
    rng = np.random.default_rng([seed, 7, step])
    wrong = rng.random(count) < carry_drop_fraction
    answers = np.where(wrong, drop_carries(operands[:, 0], operands[:, 1]), operands.sum(1))
    return self.encode(operands, answers)

  @staticmethod
  def check_config(config) -> None:
    path = config.model.path
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    if path and any(os.path.isfile(os.path.join(path, f)) for f in tokenizer_files):
      raise ConfigError(f"model.path={path!r} has a tokenizer of its own but task.name="
                        f"'addition' brings its own character tokenizer; use a checkpoint "
                        f"written for this task (e.g. by python -m grpo_jax.train_sft), or "
                        f"task.name='gsm8k'.")
    get_reward(reward_name(config, "exact_match"), "tokens", "addition")
    check_digits(config.task.get("num_digits", 2))

  @classmethod
  def from_config(cls, config, log=print, *, num_digits=2, test_size=500, fixed_width=True,
                  reverse_answer=True) -> "AdditionTask":
    """The task's fields (task.*): operands in [0, 10^num_digits); test_size held-out
    unordered pairs; fixed_width: zero-padded operands and sum, every digit at a fixed place;
    reverse_answer: the sum least-significant digit first."""
    del log
    return cls(num_digits, test_size, config.rollout.max_new_tokens, fixed_width,
               reverse_answer, reward_name(config, "exact_match"))

  # The Task protocol (grpo_jax.data.task): eos_id, pad_id, decode, score and eval_scores are
  # CharTask's.
  def step_rewards(self, batch: PromptBatch, completion_tokens, completion_mask,
                   group_size: int):
    """Process rewards: step t is completion token t, right iff it equals target token t."""
    return tuple(np.asarray(x) for x in token_step_rewards(
        completion_tokens, completion_mask, *self._targets(batch, group_size)))

  def supervised_example(self, prompt: str, response: str) -> tuple[list, list]:
    """(prompt ids, response ids) of a text pair: "<bos>12+34=" and "64<eos>"."""
    return self.tokenizer.encode(prompt, bos=True), self.tokenizer.encode(response, eos=True)

  def labels(self, batch: PromptBatch) -> list[str]:
    """The target answers as text (as the task writes them), for rewards reading text."""
    return self.decode(batch.target_tokens, batch.target_mask)

  def prompt_texts(self, batch: PromptBatch) -> list[str]:
    """The prompts as text ("<bos>12+34=" decoded)."""
    return self.decode(batch.prompt_tokens, batch.prompt_mask)

  def device_task(self) -> DeviceTask:
    """The stream and the reward as JAX functions (train.fused_steps)."""
    fields = ("prompt_tokens", "prompt_mask", "target_tokens", "target_mask")

    def stream(seed: int, count: int):
      batch = self.train_batch(0, count, seed)
      return {f: getattr(batch, f) for f in fields}

    def prompts(table, position, count: int):
      return PromptBatch(*[jax.lax.dynamic_slice_in_dim(table[f], position, count)
                           for f in fields], operands=None)

    def rewards(batch, tokens, mask, group_size: int):
      return self.reward.fn(tokens, mask, *self._targets(batch, group_size, jnp))

    def step_rewards(batch, tokens, mask, group_size: int):
      return token_step_rewards(tokens, mask, *self._targets(batch, group_size, jnp))

    return DeviceTask(stream, prompts, rewards, step_rewards)
