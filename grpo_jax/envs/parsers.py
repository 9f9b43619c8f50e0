"""Tool-call parsers (env.tool_parser): an assistant turn's text -> the tool calls it makes.

    hermes    Hermes / Qwen 2.5+ / Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
              one block per call (what their chat templates' `tools=` ask the model to write)
    pythonic  Llama 3.2 / Llama 4's pythonic form: [name(arg=1, other="x"), ...], read by
              Python's ast (literals only, nothing evaluated)

A parser returns a list of ToolCall, or of ParseFailure for a call it found but cannot read
(each becomes a "tool" message saying what is wrong, envs/tools.py). Text without calls gives
[]. Register another with TOOL_CALL_PARSERS.register("name"). TOOL_CALL_WRITERS holds the
inverse of each, write(name, arguments) -> the text of one call, for demonstrations (a task's
supervised warm-up examples).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, NamedTuple

from grpo_jax.registry import Registry

TOOL_CALL_PARSERS = Registry("env.tool_parser")
TOOL_CALL_WRITERS = Registry("env.tool_parser")


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


@TOOL_CALL_PARSERS.register("hermes")
def parse_hermes(text: str) -> list:
  calls = []
  for body in _HERMES.findall(text):
    body = body.strip()
    try:
      call = json.loads(body)
    except json.JSONDecodeError as e:
      calls.append(ParseFailure(body, f"the tool call is not valid JSON ({e.msg} at character "
                                      f"{e.pos}); write {{\"name\": ..., \"arguments\": {{...}}}}."))
      continue
    calls.append(_checked(call, body))
  return calls


def _checked(call: Any, body: str):
  if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
    return ParseFailure(body, "the tool call has no \"name\" string; write {\"name\": ..., "
                              "\"arguments\": {...}}.")
  arguments = call.get("arguments", call.get("parameters", {}))
  if isinstance(arguments, str):  # some models write the arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError:
      pass
  if not isinstance(arguments, dict):
    return ParseFailure(body, f"the arguments of {call['name']!r} are not an object; write "
                              f"\"arguments\": {{\"name\": value, ...}}.")
  return ToolCall(call["name"], arguments)


_PYTHONIC = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(.*\)\s*\]", re.DOTALL)


@TOOL_CALL_PARSERS.register("pythonic")
def parse_pythonic(text: str) -> list:
  match = _PYTHONIC.search(text)
  if match is None:
    return []
  body = match.group(0)
  try:
    tree = ast.parse(body, mode="eval").body
  except SyntaxError as e:
    return [ParseFailure(body, f"the tool calls are not a Python list of calls ({e.msg}); "
                               f"write [name(arg=value, ...)].")]
  calls = []
  for node in tree.elts if isinstance(tree, ast.List) else [tree]:
    written = ast.get_source_segment(body, node) or body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
            and all(k.arg for k in node.keywords)):
      calls.append(ParseFailure(written, "each tool call is name(arg=value, ...) with keyword "
                                         "arguments only."))
      continue
    try:
      arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
      calls.append(ParseFailure(written, f"the arguments of {node.func.id!r} must be literals "
                                         f"(numbers, strings, lists, dicts)."))
      continue
    calls.append(ToolCall(node.func.id, arguments))
  return calls
