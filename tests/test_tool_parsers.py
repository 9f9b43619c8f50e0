"""The tool-call parsers (grpo_jax/envs/parsers.py): hermes and pythonic calls, what cannot be
read, hostile text as a parse failure, and the pythonic span in linear time."""

import time

from grpo_jax.envs.parsers import TOOL_CALL_PARSERS, ParseFailure, ToolCall

hermes, pythonic = TOOL_CALL_PARSERS.get("hermes"), TOOL_CALL_PARSERS.get("pythonic")


def test_hermes_calls_and_what_cannot_be_read():
  text = ('Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": '
          '"2*3"}}\n</tool_call><tool_call>{"name": "search", "arguments": "{\\"query\\": '
          '\\"cats\\"}"}</tool_call>')
  assert hermes(text) == [ToolCall("calculator", {"expression": "2*3"}),
                          ToolCall("search", {"query": "cats"})]
  assert hermes("no calls here") == []
  broken, nameless = hermes('<tool_call>{"name": "calculator", </tool_call>'
                            '<tool_call>{"arguments": {}}</tool_call>')
  assert isinstance(broken, ParseFailure) and "not valid JSON" in broken.why
  assert isinstance(nameless, ParseFailure) and "no \"name\"" in nameless.why


def test_pythonic_calls_read_literals_only():
  assert pythonic('[calculator(expression="1 + 2"), search(query="x")]') == [
      ToolCall("calculator", {"expression": "1 + 2"}), ToolCall("search", {"query": "x"})]
  positional, computed = pythonic('[calculator("1"), search(query=open("f"))]')
  assert isinstance(positional, ParseFailure) and isinstance(computed, ParseFailure)
  assert pythonic("Answer: 42") == []


def test_hostile_call_text_is_a_parse_failure_never_an_exception():
  """Round 5's P03, P04 and P07: text a degenerate policy writes. Nesting past what json / ast
  can read is a ParseFailure (it raised RecursionError / MemoryError and ended the run); a turn
  of 1,000 calls keeps its first MAX_CALLS_PER_TURN and one failure for the rest."""
  from grpo_jax.envs.parsers import MAX_CALLS_PER_TURN  # noqa: PLC0415
  for parsed in (hermes("<tool_call>" + "[" * 1000), hermes("<tool_call>" + "[" * 100_000),
                 pythonic("[calculator(expression=" + "-" * 200_000 + "1)]"),
                 pythonic("[calculator(expression=" + "-" * 5_000 + "1)]"),
                 pythonic("[calculator(expression=" + "(" * 300 + "1" + ")" * 300 + ")]")):
    (failure,) = parsed
    assert isinstance(failure, ParseFailure) and ("nested too deeply" in failure.why or
                                                  "too many nested parentheses" in failure.why)
  for text in ("[" + ", ".join(["calculator(expression='1+1')"] * 1000) + "]",
               '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}'
               '</tool_call>' * 1000):
    calls = (pythonic if text.startswith("[") else hermes)(text)
    assert calls[:-1] == [ToolCall("calculator", {"expression": "1+1"})] * MAX_CALLS_PER_TURN
    assert calls[-1].why == (f"a turn makes at most {MAX_CALLS_PER_TURN} tool calls; the "
                             f"{1000 - MAX_CALLS_PER_TURN} after them were not run.")
  # a failed call is shown as written, non-ASCII text included (ast counts UTF-8 bytes)
  assert pythonic('[calculator(expression="é"), search(query=open("f"))]')[1].text == \
      'search(query=open("f"))'


def test_the_pythonic_span_is_the_regexs_in_linear_time():
  """pythonic_span finds what the regex [name(.*)] (DOTALL, greedy) matches, on 20,000 drawn
  texts of its pieces; and a megabyte of unclosed calls ("[f(" x 333,334: about 100 s for
  the regex, which retries `.*` from every "[f(") takes well under a second."""
  import random  # noqa: PLC0415
  import re  # noqa: PLC0415

  from grpo_jax.envs.parsers import pythonic_span  # noqa: PLC0415
  regex = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(.*\)\s*\]", re.DOTALL)
  rng, found = random.Random(0), 0
  for _ in range(20_000):
    text = "".join(rng.choice(["[", "]", "(", ")", " ", "\n", "\u00a0", "a", "_1", ".", ",",
                                "=", '"', "[f(", ")]", ") ]"]) for _ in range(rng.randint(0, 12)))
    match = regex.search(text)
    assert pythonic_span(text) == (match and match.span()), repr(text)
    found += match is not None
  assert found > 200  # the draw reaches matches, not only misses
  started = time.perf_counter()
  assert pythonic("[f(" * 333_334) == []
  assert time.perf_counter() - started < 1.0


def test_an_integer_past_pythons_digit_limit_is_a_parse_failure():
  """json.loads raises ValueError, not JSONDecodeError, on an integer of over 4,300 digits: in
  the call and in arguments written as a JSON string."""
  big = "9" * 5000
  (failure,) = hermes('<tool_call>{"name": "f", "arguments": {"n": ' + big + "}}</tool_call>")
  assert failure.why == "the tool call holds an integer of more than 4300 digits; write " \
                        "shorter numbers."
  (failure,) = hermes('<tool_call>{"name": "f", "arguments": "{\\"n\\": ' + big + '}"}'
                      "</tool_call>")
  assert failure.why.startswith("the arguments of 'f' are not an object")
  (failure,) = pythonic("[f(n=" + big + ")]")
  assert isinstance(failure, ParseFailure)
