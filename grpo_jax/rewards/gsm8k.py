"""GSM8K answer extraction and scoring, as verl scores it (so numbers compare):

* only the last 300 characters of a completion are searched;
* strict: the last "#### <number>" ("-?[0-9.,]+");
* flexible: the last number anywhere in those characters;
* numbers are normalised before comparing: commas and "$" dropped, a trailing "." dropped,
  and a whole number written with decimals ("18.00") compared as "18";
* score: 1.0 if the extracted answer equals the gold one, `format_score` if an answer was
  extracted but is wrong, 0.0 if none was.
"""

from __future__ import annotations

import re

from grpo_jax.errors import ConfigError
from grpo_jax.rewards.registry import get_reward, register_reward

_TAIL_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")
_GOLD = re.compile(r"####\s*(.+?)\s*$")


def normalize_number(text: str | None) -> str | None:
  """'1,234' -> '1234', '$18.00' -> '18', '18.' -> '18', '-3.50' -> '-3.5'; None if no digit."""
  if text is None:
    return None
  text = text.replace(",", "").replace("$", "").strip().rstrip(".")
  if not any(c.isdigit() for c in text):
    return None
  try:
    value = float(text)
  except ValueError:
    return text
  if value == int(value) and abs(value) < 1e15:
    return str(int(value))
  return repr(value).rstrip("0").rstrip(".") if "e" not in repr(value) else text


def extract_strict(completion: str) -> str | None:
  matches = _STRICT.findall(completion[-_TAIL_CHARS:])
  return normalize_number(matches[-1]) if matches else None


def extract_flexible(completion: str) -> str | None:
  for candidate in reversed(_NUMBER.findall(completion[-_TAIL_CHARS:])):
    normalized = normalize_number(candidate)
    if normalized is not None:
      return normalized
  return None


def gold_answer(answer_field: str) -> str:
  """The gold answer of a GSM8K `answer` field: what follows '####', normalised."""
  match = _GOLD.search(answer_field.strip().splitlines()[-1] if answer_field.strip() else "")
  if match is None:
    raise ValueError(f"GSM8K answer {answer_field[-60:]!r} has no '#### <number>' line.")
  return normalize_number(match.group(1)) or match.group(1)


def _score(extracted: str | None, gold: str, format_score: float) -> float:
  if extracted is None:
    return 0.0
  return 1.0 if extracted == normalize_number(gold) else format_score


def strict_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  return _score(extract_strict(completion), gold, format_score)


def flexible_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  return _score(extract_flexible(completion), gold, format_score)


def format_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  """1.0 if the completion has a '#### <number>' answer at all, right or wrong."""
  del gold, format_score
  return 1.0 if extract_strict(completion) is not None else 0.0


for _name, _fn in (("gsm8k_strict", strict_reward), ("gsm8k_flexible", flexible_reward),
                  ("gsm8k_format", format_reward)):
  register_reward(_name, kind="text")(_fn)


def get_reward_function(name: str):
  """The text reward registered as `name` (reward.name), e.g. gsm8k_strict."""
  try:
    return get_reward(name, "text", "gsm8k").fn
  except ConfigError as e:
    raise ValueError(str(e)) from None
