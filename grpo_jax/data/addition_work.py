"""Addition where the model may show its work or not: correct answers of different lengths, the
task of DRPO's demonstration (configs/drpo_tiny.py, docs/variants.md, "DRPO").

The prompt is the addition task's ("<bos>07+68="). A completion is correct when the text after
its last "=" (all of it when there is none) is the answer, as the addition task writes it, and
it ends with <eos>. The work is the column sums, least significant first, each as two digits
with its carry in: 07+68 -> "15" (7+8) "07" (0+6+1), then "=" and the answer "570" (reversed,
zero-padded): "1507=570<eos>", 9 tokens, against "570<eos>", 4. The supervised warm-up shows the
work on a `work_fraction` of its targets, so the warmed-up policy writes both forms.

Rewards: 1 for a correct completion, 0 otherwise; with `length_penalty` = alpha > 0 a correct
completion of |o| tokens gets 1 - alpha |o| / N (N = rollout.max_new_tokens), the length-
penalised reward that GRPO's group normalisation can turn into a negative advantage for a long
correct answer (the case DRPO is built for). Evaluation reports eval_accuracy (greedy, correct)
and eval_length (the mean completion length in tokens).
"""

from __future__ import annotations

import numpy as np

from grpo_jax.data.arithmetic import AdditionTask, PromptBatch
from grpo_jax.data.task import register_task
from grpo_jax.errors import ConfigError
from grpo_jax.data.tokenizer import pad_rows


def column_work(a: int, b: int, digits: int, carries: bool = True) -> str:
  """The column sums of a + b, least significant first, two digits each, carry in included
  (dropped with carries=False): column_work(7, 68, 2) == "1507"."""
  out, carry = [], 0
  for i in range(digits):
    total = (a // 10 ** i) % 10 + (b // 10 ** i) % 10 + carry
    out.append(f"{total:02d}")
    carry = total // 10 if carries else 0
  return "".join(out)


@register_task("addition_work", capabilities=("warmup",))
class AdditionWorkTask(AdditionTask):
  """The addition task whose completions may show their work (module docstring)."""

  def __init__(self, num_digits: int, test_size: int, max_new_tokens: int,
               work_fraction: float, length_penalty: float):
    work_len = 2 * num_digits + 1
    if max_new_tokens < num_digits + 2 + work_len:
      raise ConfigError(f"rollout.max_new_tokens={max_new_tokens} is shorter than an answer "
                       f"with its work ({num_digits + 2 + work_len} tokens); raise it.")
    super().__init__(num_digits, test_size, max_new_tokens, fixed_width=True,
                     reverse_answer=True)
    if not 0 <= work_fraction <= 1 or length_penalty < 0:
      raise ConfigError(f"task.work_fraction={work_fraction} must be in [0, 1] and "
                       f"task.length_penalty={length_penalty} >= 0.")
    self.work_fraction, self.length_penalty = work_fraction, length_penalty

  @classmethod
  def from_config(cls, config, log=print, *, num_digits=2, test_size=500, work_fraction=0.5,
                  length_penalty=0.0) -> "AdditionWorkTask":
    """task.work_fraction: the warm-up targets that show their work; task.length_penalty:
    alpha of the correct completions' reward 1 - alpha |o| / N (0 = plain 0/1)."""
    del log
    return cls(num_digits, test_size, config.rollout.max_new_tokens, work_fraction,
               length_penalty)

  def warmup_batch(self, step: int, count: int, seed: int,
                   carry_drop_fraction: float) -> PromptBatch:
    """The addition task's warm-up (carries dropped from `carry_drop_fraction` of the answers),
    with the work written before the answer on `work_fraction` of the targets."""
    batch = super().warmup_batch(step, count, seed, carry_drop_fraction)
    rng = np.random.default_rng([seed, 11, step])
    show = rng.random(count) < self.work_fraction
    tok, d = self.tokenizer, self.num_digits
    targets = []
    for (a, b), t, m, s in zip(batch.operands, batch.target_tokens, batch.target_mask, show):
      answer = tok.decode(t[m].tolist())
      carried = answer[::-1].lstrip("0") == str(a + b).lstrip("0")
      work = column_work(int(a), int(b), d, carries=carried) + "=" if s else ""
      targets.append(tok.encode(work + answer, eos=True))
    tt, tm = pad_rows(targets, self.max_new_tokens, tok.pad_id, left=False)
    return PromptBatch(batch.prompt_tokens, batch.prompt_mask, tt, tm, batch.operands)

  def _correct_and_length(self, batch: PromptBatch, completion_tokens, completion_mask,
                          group_size: int):
    tokens = np.asarray(completion_tokens)
    mask = np.asarray(completion_mask, bool)
    answers = np.repeat(np.asarray(self.labels(batch)), group_size)
    eos = self.tokenizer.eos_id
    correct = np.zeros(len(tokens), bool)
    for i, (t, m) in enumerate(zip(tokens, mask)):
      ids = t[m].tolist()
      if ids and ids[-1] == eos:
        correct[i] = self.tokenizer.decode(ids).split("=")[-1] == answers[i]
    return correct, mask.sum(1)

  def score(self, batch: PromptBatch, completion_tokens, completion_mask, group_size: int):
    correct, lengths = self._correct_and_length(batch, completion_tokens, completion_mask,
                                                group_size)
    reward = 1.0 - self.length_penalty * lengths / self.max_new_tokens
    return np.where(correct, reward, 0.0).astype(np.float32)

  def eval_scores(self, batch: PromptBatch, completion_tokens, completion_mask) -> dict:
    correct, lengths = self._correct_and_length(batch, completion_tokens, completion_mask, 1)
    return {"eval_accuracy": correct.astype(np.float32),
            "eval_length": lengths.astype(np.float32)}
