"""Tool-call parsers (env.tool_parser): an assistant turn's text -> the tool calls it makes.

    hermes    Hermes / Qwen 2.5+ / Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
              one block per call (what their chat templates' `tools=` ask the model to write)
    pythonic  Llama 3.2 / Llama 4's pythonic form: [name(arg=1, other="x"), ...], read by
              Python's ast (literals only, nothing evaluated)

A parser returns a list of ToolCall, or of ParseFailure for a call it found but cannot read
(each becomes a "tool" message saying what is wrong, envs/tools.py). Text without calls gives
[]. The text is the policy's, so hostile: a parser never raises (a call nested past what the
JSON or Python parser can read is a ParseFailure), takes time linear in the text, and reads at
most MAX_CALLS_PER_TURN calls of a turn (the rest become one ParseFailure, not run). Register another with TOOL_CALL_PARSERS.register("name"). TOOL_CALL_WRITERS holds the
inverse of each, write(name, arguments) -> the text of one call, for demonstrations (a task's
supervised warm-up examples).
"""

from __future__ import annotations

import ast
import json
import re
import sys
import threading
from typing import Any, NamedTuple

from grpo_jax.registry import Registry

TOOL_CALL_PARSERS = Registry("env.tool_parser")
TOOL_CALL_WRITERS = Registry("env.tool_parser")
# A degenerate policy repeats calls until max_new_tokens: a turn runs this many, the rest are one
# ParseFailure.
MAX_CALLS_PER_TURN = 32
_TOO_DEEP = (RecursionError, MemoryError)  # what deep nesting raises in json and ast


@TOOL_CALL_WRITERS.register("hermes")
def write_hermes(name: str, arguments: dict) -> str:
  return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@TOOL_CALL_WRITERS.register("pythonic")
def write_pythonic(name: str, arguments: dict) -> str:
  return f"[{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})]"


class ToolCall(NamedTuple):
  name: str
  arguments: dict


class ParseFailure(NamedTuple):
  text: str  # the call as written
  why: str  # one sentence


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _capped(calls: list, total: int, text: str) -> list:
  """The first MAX_CALLS_PER_TURN of a turn's `total` calls, and one ParseFailure for the rest."""
  if total <= MAX_CALLS_PER_TURN:
    return calls
  extra = total - MAX_CALLS_PER_TURN
  return calls + [ParseFailure(
      text[-200:], f"a turn makes at most {MAX_CALLS_PER_TURN} tool calls; the {extra} after "
                   f"them were not run.")]


def _too_deep(body: str) -> ParseFailure:
  return ParseFailure(body[:200], "the tool call is nested too deeply to read; write "
                                  "{\"name\": ..., \"arguments\": {...}} with plain values.")


@TOOL_CALL_PARSERS.register("hermes")
def parse_hermes(text: str) -> list:
  calls, bodies = [], _HERMES.findall(text)
  for body in bodies[:MAX_CALLS_PER_TURN]:
    body = body.strip()
    try:
      call = json.loads(body)
    except json.JSONDecodeError as e:
      calls.append(ParseFailure(body, f"the tool call is not valid JSON ({e.msg} at character "
                                      f"{e.pos}); write {{\"name\": ..., \"arguments\": {{...}}}}."))
      continue
    except _TOO_DEEP:  # deep nesting ("[" x 1,000) is a parse failure, not a RecursionError
      calls.append(_too_deep(body))
      continue
    except ValueError:  # (JSONDecodeError's base) an integer past Python's digit limit
      calls.append(ParseFailure(body[:200], f"the tool call holds an integer of more than "
                                            f"{sys.get_int_max_str_digits()} digits; write "
                                            f"shorter numbers."))
      continue
    calls.append(_checked(call, body))
  return _capped(calls, len(bodies), text)


def _checked(call: Any, body: str):
  if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
    return ParseFailure(body, "the tool call has no \"name\" string; write {\"name\": ..., "
                              "\"arguments\": {...}}.")
  arguments = call.get("arguments", call.get("parameters", {}))
  if isinstance(arguments, str):  # some models write the arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except (ValueError, *_TOO_DEEP):  # (JSONDecodeError's base; a 5,000-digit integer)
      pass
  if not isinstance(arguments, dict):
    return ParseFailure(body, f"the arguments of {call['name']!r} are not an object; write "
                              f"\"arguments\": {{\"name\": value, ...}}.")
  return ToolCall(call["name"], arguments)


# The pythonic calls' span: from the first "[name(" to the last ")]" after it (whitespace allowed
# inside both), as the regex \[\s*name\s*\(.*\)\s*\] (DOTALL) would match, but in linear time: that
# regex retries `.*` from every "[name(", quadratic in a text of unclosed calls (0.85 s for 96 kB).
_CALLS_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_CALLS_END_REVERSED = re.compile(r"\]\s*\)")


def pythonic_span(text: str) -> tuple[int, int] | None:
  """(start, end) of the pythonic calls in `text`, or None (see _CALLS_START)."""
  start = _CALLS_START.search(text)
  if start is None:
    return None
  # the last ")" at or after the start's "(" end, with "]" after it: the first in reverse
  end = _CALLS_END_REVERSED.search(text[::-1], 0, len(text) - start.end())
  return None if end is None else (start.start(), len(text) - end.start())


def _segments(body: str):
  """node -> its source text, in time linear in `body` altogether (ast.get_source_segment splits
  the whole text at every call, quadratic in the calls). ast's columns count
  UTF-8 bytes."""
  data = body.encode("utf-8")
  starts = [0]
  for line in data.splitlines(keepends=True):
    starts.append(starts[-1] + len(line))

  def segment(node) -> str:
    begin = starts[node.lineno - 1] + node.col_offset
    end = starts[node.end_lineno - 1] + node.end_col_offset
    return data[begin:end].decode("utf-8", "replace")
  return segment


# CPython 3.11 keeps the AST builder's recursion depth in state that every thread shares
# (cpython gh-106905): two threads parsing at once (an episode pool's workers) can fail with
# "SystemError: AST constructor recursion depth mismatch". One parse at a time.
_AST_LOCK = threading.Lock()


def parse_expression(text: str) -> ast.expr:
  """ast.parse(text, mode="eval").body, one thread at a time (above)."""
  with _AST_LOCK:
    return ast.parse(text, mode="eval").body


@TOOL_CALL_PARSERS.register("pythonic")
def parse_pythonic(text: str) -> list:
  span = pythonic_span(text)
  if span is None:
    return []
  body = text[span[0]:span[1]]
  try:
    tree = parse_expression(body)
  except SyntaxError as e:
    return [ParseFailure(body, f"the tool calls are not a Python list of calls ({e.msg}); "
                               f"write [name(arg=value, ...)].")]
  except (*_TOO_DEEP, ValueError):  # a huge expression: a parse failure
    return [ParseFailure(body[:200], "the tool calls are nested too deeply to read; write "
                                     "[name(arg=value, ...)] with plain values.")]
  segment = _segments(body)
  calls, nodes = [], tree.elts if isinstance(tree, ast.List) else [tree]
  for node in nodes[:MAX_CALLS_PER_TURN]:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
            and all(k.arg for k in node.keywords)):
      calls.append(ParseFailure(segment(node), "each tool call is name(arg=value, ...) with "
                                               "keyword arguments only."))
      continue
    try:
      arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except (ValueError, TypeError, SyntaxError, *_TOO_DEEP):
      calls.append(ParseFailure(segment(node), f"the arguments of {node.func.id!r} must be "
                                               f"literals (numbers, strings, lists, dicts)."))
      continue
    calls.append(ToolCall(node.func.id, arguments))
  return _capped(calls, len(nodes), body)
