"""Tools an environment offers, and running the calls of an assistant turn.

A Tool is a name, a description and its parameters as JSON Schema (what the chat template's
`tools=` shows the model, transformers' format), and a Python function of those parameters
returning text. `call_tools` runs a turn's parsed calls (envs/parsers.py) and returns one
"tool" message per call; what goes wrong becomes the message, counted by kind in ERROR_KINDS,
and never raises:

    malformed      the call could not be read (a ParseFailure)
    unknown_tool   no tool of that name
    bad_arguments  missing, unexpected or mistyped arguments
    exception      the tool raised
    timeout        the tool ran past its time limit, counted from when it got a slot of the
                   pool (it is abandoned, not awaited), or waited that long for one
                   (it is cancelled: it never runs)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable

from grpo_jax.unicode_text import clean_text
from grpo_jax.envs.parsers import ParseFailure
from grpo_jax.errors import ConfigError

ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout")
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
               "array": list, "object": dict}
MAX_RESULT_CHARS = 2000


@dataclasses.dataclass(frozen=True)
class Tool:
  name: str
  description: str
  parameters: dict  # JSON Schema: {"type": "object", "properties": {...}, "required": [...]}
  function: Callable[..., str]
  timeout_s: float = 10.0

  def schema(self) -> dict:
    """The tool as transformers' apply_chat_template(tools=...) takes it."""
    return {"type": "function", "function": {"name": self.name, "description": self.description,
                                             "parameters": self.parameters}}


@dataclasses.dataclass(frozen=True)
class CallOutcome:
  message: dict  # {"role": "tool", "name": ..., "content": ...}
  error: str = ""  # one of ERROR_KINDS, "" when the tool answered
  seconds: float = 0.0


def _argument_problem(tool: Tool, arguments: dict) -> str:
  """One sentence on what is wrong with the arguments, or ""."""
  props = tool.parameters.get("properties", {})
  missing = [k for k in tool.parameters.get("required", []) if k not in arguments]
  unexpected = [k for k in arguments if k not in props]
  if missing or unexpected:
    return (f"{tool.name} takes {', '.join(props) or 'no arguments'}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unexpected {', '.join(unexpected)}" if unexpected else "") + ".")
  for k, v in arguments.items():
    declared = props[k].get("type") if isinstance(props[k], dict) else None
    names = declared if isinstance(declared, list) else [declared]
    if not names or not all(isinstance(n, str) and (n in _JSON_TYPES or n == "null")
                            for n in names):
      continue  # no type, or one this check does not know: the tool reads the value itself
    if not any(_is_type(v, n) for n in names):
      return f"{tool.name}'s {k} must be a {' or '.join(names)}, not {type(v).__name__}."
  return ""


def _is_type(value, name: str) -> bool:
  """Whether `value` is of the JSON Schema type `name` ("null" is None; a bool is a boolean
  only, not an integer or a number)."""
  if name == "null":
    return value is None
  if isinstance(value, bool):
    return name == "boolean"
  return isinstance(value, _JSON_TYPES[name])


def _timed(clock: list, function, /, **arguments):
  """function(**arguments), its start time written to clock[0]: run on the pool, so a call's
  clock starts when it gets its slot, not while it waits for one."""
  clock[0] = time.perf_counter()
  return function(**arguments)


class _Expired(Exception):
  """A tool call's time ran out (not a TimeoutError, which a tool may raise itself: a socket's)."""


def _wait(future, clock: list, timeout_s: float):
  """The call's result, waited for at most timeout_s from when it got its slot (clock[0]). A
  call still waiting for a slot timeout_s after this wait began is cancelled (it never runs).
  _Expired when either time is up; the tool's own exception (its TimeoutError too) as raised."""
  began = time.perf_counter()
  while True:
    started = clock[0]
    deadline = (began if started is None else started) + timeout_s
    try:
      return future.result(timeout=max(deadline - time.perf_counter(), 0))
    except concurrent.futures.TimeoutError:
      if future.done():  # the tool raised it, or ended just now: its own outcome
        return future.result()
      if started is not None or future.cancel():
        raise _Expired from None
      # (it got its slot meanwhile: it runs on its own clock from there)


class ToolPool(concurrent.futures.Executor):
  """Runs each tool call on a daemon thread of its own, at most `max_workers` at once. A call
  abandoned after its timeout never keeps the process alive: ThreadPoolExecutor's workers are
  joined when the interpreter exits, so one hung tool would hold a finished run forever."""

  def __init__(self, max_workers: int):
    self._slots = threading.BoundedSemaphore(max(int(max_workers), 1))

  def submit(self, fn, /, *args, **kwargs):
    future = concurrent.futures.Future()

    def run():
      with self._slots:
        if not future.set_running_or_notify_cancel():
          return
        try:
          future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001  SystemExit too: the caller reads it
          future.set_exception(e)
    threading.Thread(target=run, daemon=True, name="tool").start()
    return future

  def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
    del wait, cancel_futures  # a running call is abandoned, never awaited


def _message(name: str, content: str) -> dict:
  if len(content) > MAX_RESULT_CHARS:
    content = content[:MAX_RESULT_CHARS] + f"... [{len(content) - MAX_RESULT_CHARS} more chars]"
  return {"role": "tool", "name": name, "content": clean_text(content)}


def call_tools(calls: list, tools: dict, pool: concurrent.futures.Executor) -> list:
  """[CallOutcome] of the parsed `calls` (ToolCall or ParseFailure), in their order; `tools`
  {name: Tool}; each call runs on `pool`, waited for at most its tool's timeout_s."""
  outcomes, pending = [], []
  for call in calls:
    if isinstance(call, ParseFailure):
      outcomes.append(CallOutcome(_message("error", f"Error: {call.why}"), "malformed"))
      continue
    tool = tools.get(call.name)
    if tool is None:
      outcomes.append(CallOutcome(_message(call.name, f"Error: there is no tool {call.name!r}; "
                                           f"the tools are {', '.join(sorted(tools)) or 'none'}."),
                                  "unknown_tool"))
      continue
    problem = _argument_problem(tool, call.arguments)
    if problem:
      outcomes.append(CallOutcome(_message(call.name, f"Error: {problem}"), "bad_arguments"))
      continue
    outcomes.append(None)
    clock = [None]
    pending.append((len(outcomes) - 1, tool, call, clock,
                    pool.submit(_timed, clock, tool.function, **call.arguments)))
  for index, tool, call, clock, future in pending:
    try:
      result = _wait(future, clock, tool.timeout_s)
      outcomes[index] = CallOutcome(_message(call.name, str(result)), "",
                                    time.perf_counter() - clock[0])
    except _Expired:
      outcomes[index] = CallOutcome(_message(call.name, f"Error: {call.name} took longer than "
                                             f"{tool.timeout_s:g} s and was stopped."), "timeout",
                                    tool.timeout_s)
    except BaseException as e:  # noqa: BLE001  (a tool's failure is the model's to read)
      if not isinstance(e, Exception) and not (future.done() and future.exception() is e):
        raise  # not the tool's: e.g. Ctrl-C while this thread waited
      if isinstance(e, ConfigError):
        raise  # the set-up's, not the call's: e.g. a sandbox that cannot isolate here
      # (a tool's sys.exit() or KeyboardInterrupt is its failure too: it must not end the run)
      outcomes[index] = CallOutcome(_message(call.name, f"Error: {call.name} failed: "
                                             f"{type(e).__name__}: {e}"), "exception",
                                    time.perf_counter() - clock[0] if clock[0] else 0.0)
  return outcomes
