"""Scoring a completion that should be a number and nothing else (the chat_arithmetic task).

Three readings of one completion, against the gold answer (an integer as a string):
  format   the completion is a bare number: optional spaces, an optional sign, digits, an
           optional final "." ("108", " 108.", "-7"); anything else around it fails;
  correct  the completion's last number is whole and equals the gold answer exactly
           ("47 + 51 = 98" and "98.0" are correct for 98, "3.98" is not; thousands separators
           "1,234" read as 1234): the task's held-out accuracy (exact match of the answer,
           eval_accuracy);
  exact    both: the bare number is the gold answer (eval_strict).

Text rewards (grpo_jax.rewards.registry, fn(completion, gold, format_score) -> float):
  number_exact   1.0 if exact, else format_score if the format holds (a bare wrong number),
                 else 0.0.
  number_shaped  1.0 if exact; 0.5 if correct but not bare ("47 + 51 = 98"); format_score if
                 bare but wrong; else 0.0. The partial credit keeps the model's own way of
                 being right rewarded while the bare answer earns more, so a group of samples
                 of a model that never answers bare still has a reward spread to learn from.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from grpo_jax.rewards.registry import register_reward

_BARE = re.compile(r"\s*(-?\d+)\.?\s*")
_NUMBER = re.compile(r"(-?\d[\d,]*)(?:\.(\d+))?")


class AnswerScores(NamedTuple):
  exact: bool
  correct: bool
  format: bool


def last_integer(text: str) -> str | None:
  """The last number of text as an integer, thousands separators removed ("1,234." -> "1234",
  "98.0" -> "98"); None if there is none or it is not whole ("3.98" is not 98)."""
  matches = _NUMBER.findall(text)
  if not matches:
    return None
  whole, fraction = matches[-1]
  return whole.replace(",", "") if not fraction.strip("0") else None


def _same_number(answer: str | None, gold: str) -> bool:
  if answer is None:
    return False
  try:
    return int(answer) == int(gold)
  except ValueError:
    return False


def answer_scores(completion: str, gold: str) -> AnswerScores:
  """(exact, correct, format) of one completion (module docstring)."""
  bare = _BARE.fullmatch(completion)
  correct = _same_number(last_integer(completion), gold)
  return AnswerScores(exact=bool(bare) and _same_number(bare.group(1), gold), correct=correct,
                      format=bool(bare))


@register_reward("number_exact", kind="text")
def number_exact(completion: str, gold: str, format_score: float = 0.0) -> float:
  s = answer_scores(completion, gold)
  return 1.0 if s.exact else (format_score if s.format else 0.0)


@register_reward("number_shaped", kind="text")
def number_shaped(completion: str, gold: str, format_score: float = 0.0) -> float:
  s = answer_scores(completion, gold)
  if s.exact:
    return 1.0
  if s.correct:
    return 0.5
  return format_score if s.format else 0.0
