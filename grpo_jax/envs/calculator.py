"""The calculator environment (env.name="calculator"): multiply two numbers of env.digits
digits, which a small model cannot do in its head, with the calculator tool.

The user asks env.question ("What is A * B? ..."). Each assistant turn either calls tools
(parsed by env.tool_parser; the results come back as "tool" messages and the episode goes on)
or answers "Answer: N" (a whole number: "Answer: 408.75" is not 408), which ends the episode
with reward 1 if N = A * B, else 0. An episode without an answer after env.max_turns turns
ends with reward 0. env.tools=False offers no tool (the control: the same task without the
calculator).

`rows(split, count)` are the problems of a split ("train" from seed 0, "test" from seed 1);
`demonstration(row, use_tool)` a solved episode's messages, for a supervised warm-up.
The state counts tool_calls, tool_errors by kind and tool_seconds (the episode metrics read
them).
"""

from __future__ import annotations

import re

import numpy as np

from grpo_jax.envs import StepResult, register_environment
from grpo_jax.errors import ConfigError
from grpo_jax.envs.builtin_tools import CALCULATOR
from grpo_jax.envs.parsers import TOOL_CALL_PARSERS, TOOL_CALL_WRITERS
from grpo_jax.envs.tools import ERROR_KINDS, ToolPool, call_tools

# The number must end there, not go on as a decimal or an exponent ("Answer: 408.75" and
# "Answer: 408e3" are not 408), though a sentence's full stop may follow ("Answer: 408.");
# [\d,] in the lookahead keeps the regex from backtracking to a shorter number.
_ANSWER = re.compile(r"Answer:\s*(-?[\d,]+)(?![\d,eE]|\.[\deE])")


def calculator_rows(count: int, digits: int, seed: int) -> list:
  """`count` problems {"a", "b"} of `digits`-digit factors, drawn from `seed`."""
  rng = np.random.default_rng(seed)
  low, high = 10 ** (digits - 1), 10 ** digits
  return [{"a": int(a), "b": int(b)} for a, b in rng.integers(low, high, size=(count, 2))]


@register_environment("calculator")
class CalculatorEnv:
  def __init__(self, *, digits: int = 4, max_turns: int = 3, tool_parser: str = "hermes",
               tools: bool = True, max_concurrency: int = 16,
               question: str = ("What is {a} * {b}? Use the calculator if you need it, then "
                                "reply 'Answer: <number>'.")):
    if not isinstance(digits, int) or not 1 <= digits <= 18:  # 0 digits would ask 0 * 0
      raise ConfigError(f"env.digits={digits!r}; use a whole number from 1 to 18 (the digits "
                        f"of each factor).")
    try:  # an unknown {field}: one sentence now, not a KeyError mid-run
      question.format(a=1, b=2)
    except (KeyError, IndexError, ValueError) as e:
      raise ConfigError(f"env.question={question!r} cannot be filled ({type(e).__name__}: "
                        f"{e}); its placeholders are {{a}} and {{b}}, the two factors.") from None
    self.digits, self.max_turns, self.max_concurrency = digits, max_turns, max_concurrency
    self.question = question
    self.parse = TOOL_CALL_PARSERS.get(tool_parser)
    self.write_call = TOOL_CALL_WRITERS.get(tool_parser)
    self.tools = (CALCULATOR,) if tools else ()
    self._by_name = {t.name: t for t in self.tools}
    self._tool_pool = ToolPool(max_concurrency)

  @staticmethod
  def jax_form(env, tokenizer):
    """The calculator's JAX form (train.experience_source="fused_episodes";
    envs/calculator_jax.py)."""
    from grpo_jax.envs.calculator_jax import CalculatorJax  # noqa: PLC0415  (imports jax)
    return CalculatorJax.of(env, tokenizer)

  def reset(self, row: dict, seed: int):
    del seed  # the problem is the row's
    state = dict(a=row["a"], b=row["b"], turn=0, tool_calls=0, tool_seconds=0.0,
                 tool_errors={k: 0 for k in ERROR_KINDS})
    return state, [{"role": "user", "content": self.question.format(a=row["a"], b=row["b"])}]

  def rows(self, split: str, count: int) -> list:
    return calculator_rows(count, self.digits, {"train": 0, "test": 1}[split])

  def demonstration(self, row: dict, use_tool: bool = True) -> list:
    """The messages after reset's of a solved episode: a calculator call, its result and the
    answer; without `use_tool`, the answer alone."""
    product = str(row["a"] * row["b"])
    answer = {"role": "assistant", "content": f"Answer: {product}"}
    if not use_tool:
      return [answer]
    call = self.write_call(CALCULATOR.name, {"expression": f"{row['a']}*{row['b']}"})
    return [{"role": "assistant", "content": call},
            {"role": "tool", "name": CALCULATOR.name, "content": product}, answer]

  def close(self):
    self._tool_pool.shutdown(wait=False, cancel_futures=True)

  def step(self, state: dict, assistant_turn: str) -> StepResult:
    state = dict(state, turn=state["turn"] + 1)
    answer = _ANSWER.search(assistant_turn)
    calls = [] if answer or not self.tools else self.parse(assistant_turn)
    if calls:
      outcomes = call_tools(calls, self._by_name, self._tool_pool)
      errors = dict(state["tool_errors"])
      for o in outcomes:
        if o.error:
          errors[o.error] += 1
      state = dict(state, tool_calls=state["tool_calls"] + len(calls), tool_errors=errors,
                   tool_seconds=state["tool_seconds"] + sum(o.seconds for o in outcomes))
      done = state["turn"] >= self.max_turns
      return StepResult(state, [o.message for o in outcomes], 0.0 if done else None, done)
    digits = answer.group(1).replace(",", "") if answer else ""
    right = digits.lstrip("-").isdigit() and int(digits) == state["a"] * state["b"]
    return StepResult(state, [], float(right), True)
