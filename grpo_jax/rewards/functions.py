"""Reward functions named in the config (reward.fns), TRL's way of bringing a reward:

    # my_rewards.py, on PYTHONPATH (or give its path: reward.fns="path/to/my_rewards.py:digits")
    def digits(prompts, completions, **columns):
      return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]

    --config.reward.fns=my_rewards:digits [--config.reward.fn_weights=1.0]

Each function receives, for the B completions of one call, `prompts` (B,) the user's prompt
text, `completions` (B,) the decoded completions, and every other column of the data rows as
a keyword argument (B values each, the answer column among them), and returns B numbers. An
`async def` function is awaited. Several functions are summed with reward.fn_weights
(comma-separated, one per function; "" = all 1.0).

Built-in names (no module):
  math_verify   1.0 if the completion's final answer equals the answer column's by
                math-verify (\\frac{1}{2} = 0.5 = 1/2), else 0.0 (pip install math-verify)
  format_regex  1.0 if the whole completion matches reward.format_regex, else 0.0
  answer_number 1.0 if the completion's last number equals the answer column's last number
"""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import functools
import importlib
import inspect
import logging
import math
import os
import re
import threading
from typing import Callable

import numpy as np

from grpo_jax.errors import ConfigError, RewardTimeout
from grpo_jax.interrupts import interruptible, stop_if_signalled
from grpo_jax.registry import load_file_module


@dataclasses.dataclass(frozen=True)
class RewardFunction:
  name: str  # the spec as the config gave it, for messages and metrics
  fn: Callable
  weight: float
  timeout_s: float = 0.0  # one call's time limit (reward.timeout_s); 0 = none


def _plain(value) -> str:
  """A cell as text; a number (an answer column read from JSON) by its digits: 1e-05 is
  "0.00001"."""
  if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
    return format(decimal.Decimal(repr(value)), "f")
  return str(value)


def _number(text) -> decimal.Decimal | None:
  """The last number of text, exactly (a Decimal: 2**53 + 1 is not 2**53; ".5" is 0.5, "2e16"
  is 2e16); a number that is not a string (an answer column read from JSON) by its digits."""
  found = re.findall(r"-?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", _plain(text))
  return decimal.Decimal(found[-1].replace(",", "").rstrip(".")) if found else None


def answer_number(prompts, completions, *, answers, **_):
  """1.0 where the completion's last number equals the answer's last number."""
  del prompts
  return [float((got := _number(c)) is not None and got == _number(a))
          for c, a in zip(completions, answers)]


def answer_match(completion, answer) -> float:
  """1.0 where the completion gives the answer: the two texts, stripped, are equal, or the
  answer is a number and the completion's last number equals it (answer_number's rule; "1/2"
  is not a number here: its match needs math_verify). The held-out eval_accuracy of a table
  task with an answer column."""
  text = _plain(answer).strip()
  if text == str(completion).strip():
    return 1.0
  want = _number(text)
  if want is not None and re.fullmatch(r"-?[\d,]*\.?\d+\.?", text):  # the answer is a number
    return float(_number(completion) == want)
  return 0.0


def format_regex(prompts, completions, *, pattern, **_):
  """1.0 where the whole completion matches `pattern`."""
  del prompts
  compiled = re.compile(pattern, re.DOTALL)
  return [float(compiled.fullmatch(c.strip()) is not None) for c in completions]


def math_verify(prompts, completions, *, answers, **_):
  """1.0 where math-verify finds the completion's answer equal to the gold one."""
  del prompts
  from math_verify import parse, verify  # noqa: PLC0415
  # math-verify's own time limits use SIGALRM, which works in the main thread only; reward
  # functions run in a thread under reward.timeout_s (_call), so they are off here (and its
  # warning that they are, once per process, is not shown).
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  out = []
  for completion, answer in zip(completions, answers):
    try:
      gold = parse(str(answer), parsing_timeout=None)
      out.append(float(bool(gold) and verify(gold, parse(completion, parsing_timeout=None),
                                             timeout_seconds=None)))
    except Exception:  # noqa: BLE001  math-verify's parser raises on odd input: no match
      out.append(0.0)
  return out


def _import_module(spec: str, index: int, module: str):
  where = f"reward.fns[{index}]={spec!r}"
  if module.endswith(".py"):
    if not os.path.isfile(module):
      raise ConfigError(f"{where}: {module} is not a file (cwd {os.getcwd()}); give a path to a "
                        f".py file or an importable module name.")
    try:
      return load_file_module(module)
    except (Exception, SystemExit) as e:  # noqa: BLE001  the user's file may raise anything
      raise ConfigError(f"{where}: importing {module} failed ({type(e).__name__}: {e}); fix "
                        f"the file.") from None
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    raise ConfigError(f"{where}: module {module!r} cannot be imported ({e}); put its folder on "
                      f"PYTHONPATH, or give a path to the .py file.") from None


def _builtin(name: str, config, index: int):
  answer_field = config.data.answer_field
  if name == "format_regex":
    pattern = config.reward.format_regex
    if not pattern:
      raise ConfigError(f"reward.fns[{index}]='format_regex' needs reward.format_regex, the "
                        f"pattern a well-formatted completion matches (e.g. '.*#### -?\\d+').")
    try:
      re.compile(pattern)
    except re.error as e:
      raise ConfigError(f"reward.format_regex={pattern!r} is not a regular expression ({e}); "
                        f"fix it.") from None
    return functools.partial(format_regex, pattern=pattern)
  if name == "math_verify":
    try:
      import math_verify as _  # noqa: F401,PLC0415
    except ImportError:
      raise ConfigError("reward.fns names math_verify, which needs the math-verify package: "
                        "pip install -e '.[math]' (or pip install math-verify).") from None
  fn = {"math_verify": math_verify, "answer_number": answer_number}[name]
  return lambda prompts, completions, **columns: fn(
      prompts, completions, answers=columns.get(answer_field, [""] * len(completions)))


BUILTIN = ("math_verify", "format_regex", "answer_number")
ANSWER_READERS = ("math_verify", "answer_number")  # built-ins that read data.answer_field
# The held-out metrics eval_<name> that a reward function of that name would overwrite: the
# task's (data/table.py eval_scores) and the evaluator's (train/run/evaluation.py), with
# eval_pass_at_<k> for any k.
RESERVED_EVAL_NAMES = ("accuracy", "reward", "reward_errors")


def _reserved_eval_name(name: str) -> bool:
  return name in RESERVED_EVAL_NAMES or re.fullmatch(r"pass_at_\d+", name) is not None


def load_reward_functions(config) -> tuple[RewardFunction, ...]:
  """reward.fns, each imported and checked callable, with reward.fn_weights; ConfigError
  (one sentence naming the entry) before any compute."""
  specs = [s.strip() for s in config.reward.fns.split(",") if s.strip()]
  weights_text = [w.strip() for w in config.reward.fn_weights.split(",") if w.strip()]
  if weights_text and len(weights_text) != len(specs):
    raise ConfigError(f"reward.fn_weights={config.reward.fn_weights!r} gives "
                      f"{len(weights_text)} weights for {len(specs)} reward.fns; give one per "
                      f"function, or none (all 1.0).")
  try:
    weights = [float(w) for w in weights_text] or [1.0] * len(specs)
  except ValueError:
    weights = [math.nan]  # refused below
  if not all(map(math.isfinite, weights)):
    raise ConfigError(f"reward.fn_weights={config.reward.fn_weights!r}; give comma-separated "
                      f"finite numbers, e.g. '1.0,0.5'.")
  from grpo_jax.rewards.remote import MAX_TIMEOUT_S  # noqa: PLC0415
  timeout_s = float(config.reward.get("timeout_s", 0.0))
  if not 0 <= timeout_s <= MAX_TIMEOUT_S:
    raise ConfigError(f"reward.timeout_s={timeout_s}; give the seconds one call of a reward "
                      f"function may take (> 0, at most {MAX_TIMEOUT_S:g}, the timers' range), "
                      f"or 0 for no limit.")
  out = []
  for index, (spec, weight) in enumerate(zip(specs, weights)):
    if spec in BUILTIN:
      fn = _builtin(spec, config, index)
    else:
      module, _, attr = spec.rpartition(":")
      if not module or not attr:
        raise ConfigError(f"reward.fns[{index}]={spec!r}; give module:function (or "
                          f"path/to/file.py:function), or one of {', '.join(BUILTIN)}.")
      fn = getattr(_import_module(spec, index, module), attr, None)
      if not callable(fn):
        raise ConfigError(f"reward.fns[{index}]={spec!r}: {module} has no function {attr!r}.")
    out.append(RewardFunction(spec, fn, weight, timeout_s))
  # Several functions are each logged as eval_<function name> (data/table.py eval_scores), beside
  # the task's own eval_accuracy and eval_reward and the evaluator's eval_reward_errors and
  # eval_pass_at_<k> (train/run/evaluation.py): a name shared by two different functions, or
  # one of those, would overwrite another metric (the same spec twice gives the same values).
  names = [spec.rpartition(":")[2] for spec in dict.fromkeys(specs)]  # of the distinct specs
  clashes = sorted({n for n in names if names.count(n) > 1 or _reserved_eval_name(n)})
  if len(specs) > 1 and clashes:
    raise ConfigError(f"reward.fns={config.reward.fns!r} would log the held-out metric(s) "
                      f"{', '.join(f'eval_{n}' for n in clashes)} twice (each function's is "
                      f"eval_<its name>, beside eval_accuracy, eval_reward, eval_reward_errors "
                      f"and eval_pass_at_<k>); rename the function(s) "
                      f"{', '.join(repr(n) for n in clashes)} so that every name differs and "
                      f"none is {', '.join(RESERVED_EVAL_NAMES)} or pass_at_<k>.")
  return tuple(out)


def _call(reward: RewardFunction, prompts: list, completions: list, columns: dict):
  """What the function returns, awaited when it is a coroutine; run in its own thread with
  the time limit `reward.timeout_s`. The function gets copies of the lists, so that one which
  changes them cannot change the caller's. Whatever it raises, SystemExit and KeyboardInterrupt
  included (sys.exit(0) must not end a run as a success), is a RuntimeError naming it; past the
  time limit, a RewardTimeout (the loop saves the last step; the thread is left, a daemon)."""
  box = {}

  def work():
    try:
      value = reward.fn(list(prompts), list(completions),
                        **{k: list(v) if isinstance(v, (list, tuple)) else v
                           for k, v in columns.items()})
      box["value"] = asyncio.run(value) if inspect.isawaitable(value) else value
    except BaseException as e:  # noqa: BLE001  a user's function may raise anything: name it
      box["error"] = e

  thread = threading.Thread(target=work, name=f"reward {reward.name}", daemon=True)
  stop_if_signalled()  # a signal already in: the function is not started
  with interruptible():  # SIGTERM / SIGINT while it runs: the run saves and stops at once
    thread.start()
    thread.join(reward.timeout_s or None)
  if thread.is_alive():
    raise RewardTimeout(f"reward function {reward.name!r} did not return within "
                      f"reward.timeout_s={reward.timeout_s:g} s for {len(completions)} "
                      f"completions; make it faster, or raise reward.timeout_s (0 = no "
                      f"limit).")
  if "error" in box:
    e = box["error"]
    what = (f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else
            f"raised {type(e).__name__}: {e}")
    raise RuntimeError(f"reward function {reward.name!r} {what}") from e
  return box["value"]


class RewardCountError(ValueError):
  """A reward function returned a number of values other than its completions' count: a fault of
  the whole call, which scoring the completions one at a time may not show
  (rewards/guard.py)."""


def call_reward(reward: RewardFunction, prompts: list, completions: list,
                columns: dict) -> np.ndarray:
  """(B,) float64 values of one reward function; an error naming it when it raises (Runtime-
  Error), or returns a wrong count or a value that is not a finite number (ValueError);
  grpo_jax/rewards/guard.py then finds the rows at fault. Past reward.timeout_s, a
  RewardTimeout, which stops the run after saving its last completed step."""
  count = len(completions)
  values = _call(reward, prompts, completions, columns)
  if values is None or (isinstance(values, (list, tuple)) and any(v is None for v in values)):
    raise ValueError(f"reward function {reward.name!r} returned None"
                     f"{'' if values is None else ' for a completion'}; return one float per "
                     f"completion.")
  try:
    values = np.asarray(values, np.float64).reshape(-1)
  except (TypeError, ValueError):
    raise ValueError(f"reward function {reward.name!r} returned values that are not numbers; "
                     f"return one float per completion.") from None
  if values.shape != (count,):
    raise RewardCountError(f"reward function {reward.name!r} returned {values.size} values for "
                           f"{count} completions; return one float per completion.")
  if not np.all(np.isfinite(values)):
    raise ValueError(f"reward function {reward.name!r} returned "
                     f"{values[~np.isfinite(values)][0]}; return finite numbers.")
  return values
