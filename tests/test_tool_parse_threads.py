"""The tool-call parser and the calculator tool parse Python text one thread at a time."""

import ast
import threading
import time

from grpo_jax.envs.builtin_tools import calculate
from grpo_jax.envs.parsers import TOOL_CALL_PARSERS, ToolCall

pythonic = TOOL_CALL_PARSERS.get("pythonic")


def test_python_text_is_parsed_one_thread_at_a_time(monkeypatch):
  """CPython 3.11's AST builder shares its recursion depth between threads (cpython gh-106905):
  the calculator recipe, its episodes' turns parsed in a thread pool, stopped once with
  "SystemError: AST constructor recursion depth mismatch". The pythonic parser and the
  calculator tool never parse in two threads at once."""
  parse, inside, most = ast.parse, [0], [0]

  def slow_parse(*args, **kwargs):
    inside[0] += 1
    most[0] = max(most[0], inside[0])
    time.sleep(0.01)
    inside[0] -= 1
    return parse(*args, **kwargs)

  monkeypatch.setattr(ast, "parse", slow_parse)
  work = [lambda: pythonic('[calculator(expression="1 + 2")]'), lambda: calculate("3 * 4")]
  threads = [threading.Thread(target=work[i % 2]) for i in range(6)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert most[0] == 1
  assert pythonic('[calculator(expression="1 + 2")]') == [
      ToolCall("calculator", {"expression": "1 + 2"})] and calculate("3 * 4") == "12"
