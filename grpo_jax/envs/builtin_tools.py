"""The built-in tools: a calculator, a Python executor (envs/sandbox.py) and retrieval over a
local text corpus."""

from __future__ import annotations

import ast
import collections
import functools
import math
import operator
import re

from grpo_jax.envs.parsers import parse_expression
from grpo_jax.envs.sandbox import check_sandbox, run_python
from grpo_jax.envs.tools import Tool

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS, MAX_EXPONENT, MAX_DIGITS = 200, 64, 200


def calculate(expression: str) -> str:
  """The value of an arithmetic expression: numbers, + - * / // % **, parentheses. Parsed by
  Python's ast and evaluated node by node (no eval); anything else, and a result that is not
  a finite real number (too large, or complex: "(-8) ** 0.5"), raises ValueError."""
  if len(expression) > MAX_EXPRESSION_CHARS:
    raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
  try:
    tree = parse_expression(expression.strip())
  except SyntaxError:
    raise ValueError(f"{expression!r} is not an arithmetic expression") from None

  def value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
      return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
      return _UNARY[type(node.op)](value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
      left, right = value(node.left), value(node.right)
      if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise ValueError(f"exponents above {MAX_EXPONENT} are not computed")
      out = _BINARY[type(node.op)](left, right)
      if isinstance(out, complex):
        raise ValueError(f"{ast.unparse(node)!r} is not a real number")
      if isinstance(out, int) and abs(out) >= 10 ** MAX_DIGITS:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
      return out
    raise ValueError(f"{ast.unparse(node)!r} is not a number or an arithmetic operation")

  try:
    out = value(tree)
  except ZeroDivisionError:
    raise ValueError("division by zero") from None
  except OverflowError:
    raise ValueError("the result is too large") from None
  if isinstance(out, float) and not math.isfinite(out):  # (inf, or nan from inf's arithmetic)
    raise ValueError("the result is too large")
  if isinstance(out, float) and out.is_integer() and abs(out) < 2**53:
    return str(int(out))
  return repr(out) if isinstance(out, float) else str(out)


CALCULATOR = Tool(
    "calculator", "Evaluates an arithmetic expression (+ - * / // % ** and parentheses).",
    {"type": "object", "properties": {"expression": {
        "type": "string", "description": "e.g. 1234 * 5678"}}, "required": ["expression"]},
    calculate, timeout_s=2.0)


def _python(function, timeout_s: float) -> Tool:
  """The "python" tool calling `function`, a program's run of at most timeout_s seconds (the
  tool's own limit 5 s longer, so that the sandbox stops the program first)."""
  return Tool(
      "python", f"Runs a Python program (standard library only, no network, {timeout_s:g} s) "
      f"and returns what it prints.",
      {"type": "object", "properties": {"code": {"type": "string",
                                                 "description": "the program"}},
       "required": ["code"]},
      function, timeout_s=timeout_s + 5.0)


def python_tool(sandbox: str = "bubblewrap", timeout_s: float = 5.0) -> Tool:
  """The "python" tool: runs the policy's program isolated by the OS (envs/sandbox.py) and
  returns what it prints. Refuses in one sentence (ConfigError) to be made where `sandbox`
  cannot isolate: an environment offering it takes env.sandbox and builds it in its
  __init__, before any compute."""
  check_sandbox(sandbox)
  return _python(functools.partial(run_python, timeout_s=timeout_s, sandbox=sandbox), timeout_s)


# The same, checked at its first call rather than at import (a ConfigError then stops the run:
# envs/tools.call_tools passes it on).
PYTHON = _python(run_python, 5.0)

_WORD = re.compile(r"\w+")


def retrieval_tool(documents: list, k: int = 3, k1: float = 1.5, b: float = 0.75) -> Tool:
  """A "search" tool over `documents` (strings): the k best by BM25 of the query's words."""
  docs = [[w.lower() for w in _WORD.findall(d)] for d in documents]
  counts = [collections.Counter(d) for d in docs]
  average = sum(map(len, docs)) / max(len(docs), 1)
  frequency = collections.Counter(w for c in counts for w in c)

  def search(query: str) -> str:
    words = [w.lower() for w in _WORD.findall(query)]
    def score(i):
      total = 0.0
      for w in words:
        f = counts[i][w]
        idf = math.log(1 + (len(docs) - frequency[w] + 0.5) / (frequency[w] + 0.5))
        total += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(docs[i]) / average))
      return total
    best = sorted(range(len(docs)), key=lambda i: (-score(i), i))[:k]
    found = [f"[{i}] {documents[i]}" for i in best if score(i) > 0]
    return "\n".join(found) if found else "No document matches."

  return Tool("search", "Finds the passages of the corpus that best match a query.",
              {"type": "object", "properties": {"query": {"type": "string"}},
               "required": ["query"]}, search, timeout_s=5.0)
