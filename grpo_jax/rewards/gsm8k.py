"""GSM8K answer extraction and scoring.

`gsm8k_strict` and `gsm8k_flexible` are verl's scorer (verl/utils/reward_score/gsm8k.py,
`compute_score` with method "strict" / "flexible"), rule for rule, so that numbers compare:

* only the last 300 characters of a completion are searched;
* strict: the last "#### <number>" ("#### (-?[0-9.,]+)"), with "," and "$" removed;
* flexible: the last match of "(-?[0-9.,]+)" anywhere that is not "" or "." , as written
  (commas and a trailing "." kept);
* the answer is compared with the gold string as is: "18." or "18.00" does not equal "18", nor
  (flexible) "1,234" equal "1234";
* score: 1.0 if equal, `format_score` if an answer was extracted but differs, 0.0 if none was.

The gold answer is verl's preprocessing of GSM8K's `answer` field (examples/data_preprocess/
gsm8k.py): the first "#### <number>", commas removed.

`gsm8k_strict_lenient` and `gsm8k_flexible_lenient` extract the same way but normalise both
sides before comparing (commas and "$" dropped, a trailing "." dropped, "18.00" read as "18"):
more forgiving than verl, so their figures do not compare with verl's.
"""

from __future__ import annotations

import decimal
import re

from grpo_jax.errors import ConfigError
from grpo_jax.rewards.registry import get_reward, register_reward

_TAIL_CHARS = 300  # verl's _SOLUTION_CLIP_CHARS
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_strict(completion: str) -> str | None:
  """verl's strict answer: the last '#### <number>' of the last 300 characters, ',' and '$'
  removed; None if there is none."""
  matches = _STRICT.findall(completion[-_TAIL_CHARS:])
  return matches[-1].replace(",", "").replace("$", "") if matches else None


def extract_flexible(completion: str) -> str | None:
  """verl's flexible answer: the last number-like match of the last 300 characters that is not
  '' or '.', as written; None if nothing matches (verl's loop returns the first match when all
  are '.', and so does this)."""
  matches = _NUMBER.findall(completion[-_TAIL_CHARS:])
  answer = None
  for answer in reversed(matches):
    if answer not in ("", "."):
      break
  return answer


def normalize_number(text: str | None) -> str | None:
  """'1,234' -> '1234', '$18.00' -> '18', '18.' -> '18', '-3.50' -> '-3.5'; None if no digit
  (the lenient rewards' normalisation)."""
  if text is None:
    return None
  text = text.replace(",", "").replace("$", "").strip().rstrip(".")
  if not any(c.isdigit() for c in text):
    return None
  try:  # exactly: 9007199254740993 is not 9007199254740992
    value = decimal.Decimal(text)
  except decimal.InvalidOperation:
    return text
  if not value.is_finite():
    return text
  if value == value.to_integral_value():
    return str(int(value))
  return format(value.normalize(), "f")


def gold_answer(answer_field: str) -> str:
  """The gold answer of a GSM8K `answer` field, as verl's preprocessing writes it: the first
  '#### <number>', commas removed."""
  match = _STRICT.search(answer_field)
  if match is None:
    raise ValueError(f"GSM8K answer {answer_field[-60:]!r} has no '#### <number>' line.")
  return match.group(1).replace(",", "")


def _score(answer: str | None, gold: str, format_score: float) -> float:
  """verl's compute_score: 0 without an answer, 1 if it equals the gold string, else
  format_score."""
  if answer is None:
    return 0.0
  return 1.0 if answer == gold else format_score


def strict_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  return _score(extract_strict(completion), gold, format_score)


def flexible_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  return _score(extract_flexible(completion), gold, format_score)


def _lenient(answer: str | None, gold: str, format_score: float) -> float:
  return _score(normalize_number(answer), normalize_number(gold), format_score)


def strict_lenient_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  return _lenient(extract_strict(completion), gold, format_score)


def flexible_lenient_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  """The last number of the last 300 characters that has a digit, normalised."""
  for candidate in reversed(_NUMBER.findall(completion[-_TAIL_CHARS:])):
    if normalize_number(candidate) is not None:
      return _lenient(candidate, gold, format_score)
  return 0.0


def format_reward(completion: str, gold: str, format_score: float = 0.0) -> float:
  """1.0 if the completion has a '#### <number>' answer at all, right or wrong."""
  del gold, format_score
  return 1.0 if extract_strict(completion) is not None else 0.0


for _name, _fn in (("gsm8k_strict", strict_reward), ("gsm8k_flexible", flexible_reward),
                  ("gsm8k_strict_lenient", strict_lenient_reward),
                  ("gsm8k_flexible_lenient", flexible_lenient_reward),
                  ("gsm8k_format", format_reward)):
  register_reward(_name, kind="text")(_fn)


def get_reward_function(name: str):
  """The text reward registered as `name` (reward.name), e.g. gsm8k_strict."""
  try:
    return get_reward(name, "text", "gsm8k").fn
  except ConfigError as e:
    raise ValueError(str(e)) from None
