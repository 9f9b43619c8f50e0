"""Environments and tools (grpo_jax/envs/): every tool error kind as a tool message, the calculator against Python's arithmetic, the sandbox's limits, retrieval,
the calculator environment's episodes, and episodes that do not depend on tool timing."""

import dataclasses
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from grpo_jax.envs import ENVIRONMENTS
from grpo_jax.envs.builtin_tools import CALCULATOR, PYTHON, calculate, retrieval_tool
from grpo_jax.envs.calculator import CalculatorEnv, calculator_rows
from grpo_jax.envs.parsers import ParseFailure, ToolCall
from grpo_jax.envs.runner import EpisodeRunner
from grpo_jax.envs.sandbox import isolation_problem, run_python
from grpo_jax.envs.tools import Tool, ToolPool, call_tools

# The hook's messages and the limits hold in both sandboxes; where bubblewrap cannot run (a
# machine without it: tests/test_sandbox.py skips, saying why) they are checked unisolated.
SANDBOX = "unisolated" if isolation_problem() else "bubblewrap"


def _slow(seconds):
  time.sleep(seconds)
  return "late"


def _boom():
  raise RuntimeError("disk full")


def _exits():
  sys.exit(3)


def _interrupts():
  raise KeyboardInterrupt


def _surrogate():
  return "bad \udc80 text"


NO_ARGS = {"type": "object", "properties": {}}


def test_every_tool_error_kind_is_a_tool_message(thread_pool):
  tools = {t.name: t for t in (
      CALCULATOR,
      Tool("slow", "sleeps", {"type": "object", "properties": {"seconds": {"type": "number"}},
                              "required": ["seconds"]}, _slow, timeout_s=0.2),
      Tool("boom", "fails", NO_ARGS, _boom))}
  calls = [ParseFailure("{", "the tool call is not valid JSON."),
           ToolCall("calc", {"expression": "1"}),
           ToolCall("calculator", {}),
           ToolCall("calculator", {"expression": 7}),
           ToolCall("calculator", {"expression": "1", "extra": 1}),
           ToolCall("boom", {}),
           ToolCall("slow", {"seconds": 3}),
           ToolCall("calculator", {"expression": "1234 * 5678"})]
  started = time.perf_counter()
  outcomes = call_tools(calls, tools, thread_pool)
  assert time.perf_counter() - started < 2.5  # the slow tool is abandoned, not awaited
  assert [o.error for o in outcomes] == ["malformed", "unknown_tool", "bad_arguments",
                                         "bad_arguments", "bad_arguments", "exception",
                                         "timeout", ""]
  assert all(o.message["role"] == "tool" for o in outcomes)
  texts = [o.message["content"] for o in outcomes]
  assert texts[1] == "Error: there is no tool 'calc'; the tools are boom, calculator, slow."
  assert texts[2] == "Error: calculator takes expression; missing expression."
  assert texts[3] == "Error: calculator's expression must be a string, not int."
  assert texts[5] == "Error: boom failed: RuntimeError: disk full"
  assert texts[6] == "Error: slow took longer than 0.2 s and was stopped."
  assert texts[7] == "7006652"


def test_a_tool_that_exits_or_returns_bad_unicode_is_a_tool_message():
  """Round 5's T03 / E01: a tool's sys.exit() or KeyboardInterrupt is its failure, a message the
  model reads, never the end of the run; a result with a lone surrogate reaches the model with
  U+FFFD in its place (no tokenizer can encode it)."""
  tools = {t.name: t for t in (Tool("exits", "", NO_ARGS, _exits),
                               Tool("interrupts", "", NO_ARGS, _interrupts),
                               Tool("surrogate", "", NO_ARGS, _surrogate))}
  outcomes = call_tools([ToolCall(name, {}) for name in tools], tools, ToolPool(2))
  assert [o.error for o in outcomes] == ["exception", "exception", ""]
  assert [o.message["content"] for o in outcomes] == [
      "Error: exits failed: SystemExit: 3", "Error: interrupts failed: KeyboardInterrupt: ",
      "bad \ufffd text"]


def test_a_tools_own_timeout_error_is_its_failure_not_the_harness_timeout():
  """A tool that raises TimeoutError itself (its HTTP client's, say) was reported as stopped by
  the harness after its timeout_s (error kind "timeout", timeout_s seconds): on Python 3.11
  concurrent.futures.TimeoutError is the built-in one. It is the tool's failure, as any other."""
  def search(query: str) -> str:
    raise TimeoutError("upstream did not answer in 0.1 s")
  tool = Tool("search", "", {"type": "object", "properties": {"query": {"type": "string"}}},
              search, timeout_s=30.0)
  (out,) = call_tools([ToolCall("search", {"query": "x"})], {"search": tool}, ToolPool(1))
  assert (out.error, out.message["content"]) == (
      "exception", "Error: search failed: TimeoutError: upstream did not answer in 0.1 s")
  assert out.seconds < 5


def test_a_hung_tool_does_not_keep_a_finished_process_alive():
  """Round 5's E02: a call abandoned after its timeout (here sleeping 3,600 s) is on a daemon
  thread (envs/tools.ToolPool): the process exits when its work is done."""
  program = ("import time\nfrom grpo_jax.envs.tools import Tool, ToolPool, call_tools\n"
             "from grpo_jax.envs.parsers import ToolCall\n"
             "tool = Tool('hang', '', {'type': 'object', 'properties': {}}, "
             "lambda: time.sleep(3600), timeout_s=0.1)\n"
             "print(call_tools([ToolCall('hang', {})], {'hang': tool}, ToolPool(1))[0].error)\n")
  out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                       timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert (out.returncode, out.stdout) == (0, "timeout\n"), out.stderr[-2000:]


def test_a_list_of_types_takes_a_value_of_any_of_them():
  """transformers writes Union[int, str] as "type": ["integer", "string"]; "null" is None; a
  type the check does not know is not checked."""
  schema = {"type": "object", "properties": {"days": {"type": ["integer", "string"]},
                                             "note": {"type": ["string", "null"]},
                                             "odd": {"type": [{"not": "a name"}]}}}
  tools = {"lookup": Tool("lookup", "", schema, lambda **kwargs: "ok")}
  calls = [ToolCall("lookup", a) for a in ({"days": 3}, {"days": "3"}, {"note": None},
                                          {"odd": 1.5}, {"days": 1.5}, {"days": True})]
  outcomes = call_tools(calls, tools, ToolPool(2))
  assert [o.error for o in outcomes] == ["", "", "", "", "bad_arguments", "bad_arguments"]
  assert outcomes[4].message["content"].endswith("days must be a integer or string, not float.")


def test_a_calls_time_starts_at_its_pool_slot_and_a_call_given_up_never_runs():
  """One slot: four 0.25 s calls of a 0.6 s tool all answer (waiting for the slot is not their
  time); a call still waiting behind a hung one when its time is up is cancelled, never run."""
  ran, release = [], threading.Event()

  def work(x: str) -> str:
    ran.append(x)
    release.wait(5) if x == "hang" else time.sleep(0.25)
    return x
  tool = Tool("work", "", {"type": "object", "properties": {"x": {"type": "string"}}}, work,
              timeout_s=0.6)
  outcomes = call_tools([ToolCall("work", {"x": str(i)}) for i in range(4)], {"work": tool},
                        ToolPool(1))
  assert [o.message["content"] for o in outcomes] == ["0", "1", "2", "3"]
  outcomes = call_tools([ToolCall("work", {"x": "hang"}), ToolCall("work", {"x": "queued"})],
                        {"work": dataclasses.replace(tool, timeout_s=0.2)}, ToolPool(1))
  assert [o.message["content"] for o in outcomes] == [
      "Error: work took longer than 0.2 s and was stopped."] * 2
  release.set()
  time.sleep(0.3)
  assert ran == ["0", "1", "2", "3", "hang"]


@pytest.fixture
def thread_pool():
  import concurrent.futures  # noqa: PLC0415
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    yield pool


def test_calculator_equals_python_arithmetic_and_refuses_the_rest():
  rng = random.Random(0)
  for _ in range(300):
    expr = str(rng.randint(-999, 9999))
    for _ in range(rng.randint(1, 4)):
      expr = f"({expr}) {rng.choice(['+', '-', '*', '//', '%', '/'])} {rng.randint(1, 999)}"
    want = eval(expr)  # noqa: S307  (the reference, on expressions this test wrote)
    got = calculate(expr)
    assert float(got) == pytest.approx(want, rel=1e-12), expr
  assert calculate("2 ** 10") == "1024" and calculate("-(3 + 4) * 2") == "-14"
  for bad, why in [("__import__('os').system('ls')", "is not a number"),
                   ("(1).__class__", "is not a number"), ("9 ** 9999", "exponents above 64"),
                   ("1 / 0", "division by zero"), ("x + 1", "is not a number"),
                   ("1e200 ** 2", "the result is too large"), ("1e308 * 10", "too large"),
                   ("(-8) ** 0.5 // 1", "is not a real number"),
                   ("1 +", "is not an arithmetic expression")]:
    with pytest.raises(ValueError, match=why):
      calculate(bad)


@pytest.mark.parametrize("program,says", [
    ("while True:\n  pass", "Stopped: the program ran past its 2 s limit."),
    ("x = bytearray(10 * 2**30)", "Stopped: the program ran out of its 512 MiB of memory"),
    ("open('/tmp/grpo_jax_sandbox_escape.txt', 'w').write('x')",
     "Refused: the sandbox refuses to write /tmp/grpo_jax_sandbox_escape.txt"),
    ("import os\nfor _ in range(100):\n  os.fork()", "Refused: the sandbox refuses os.fork"),
    ("import socket\nsocket.create_connection(('example.com', 80))",
     "Refused: the sandbox refuses to import socket"),
    ("import os\nos.system('touch /tmp/grpo_jax_sandbox_escape.txt')",
     "Refused: the sandbox refuses os.system"),
    ("import grpo_jax", "ModuleNotFoundError: No module named 'grpo_jax'"),
])
def test_the_sandbox_stops_or_refuses_with_a_clear_message(program, says):
  assert says in run_python(program, timeout_s=2.0, sandbox=SANDBOX)
  assert not os.path.exists("/tmp/grpo_jax_sandbox_escape.txt")
  # and the next program runs as usual, in a fresh folder (the last one was removed)
  assert run_python("import os\nopen('f.txt', 'w').write('1')\nprint(sorted(os.listdir()))",
                    sandbox=SANDBOX,
                    timeout_s=2.0) == "['f.txt']\n"


def test_the_sandbox_truncates_its_output():
  out = PYTHON.function(code="print('x' * 5000)", sandbox=SANDBOX)
  assert out.startswith("x" * 2000) and out.endswith("[3001 more chars]")


def test_retrieval_ranks_by_bm25():
  corpus = ["The capital of France is Paris.", "Paris Hilton is a celebrity.",
            "Berlin is the capital of Germany.", "Cats sleep a lot."]
  search = retrieval_tool(corpus, k=2).function
  assert search("capital of France").splitlines() == [f"[0] {corpus[0]}", f"[2] {corpus[2]}"]
  assert search("quantum chromodynamics") == "No document matches."


def _episode(env, row, turns):
  state, messages = env.reset(row, 0)
  trace = [messages]
  for turn in turns:
    result = env.step(state, turn)
    trace.append((result.messages, result.reward, result.done))
    state = result.state
    if result.done:
      break
  return trace, state


def test_calculator_episodes():
  env = ENVIRONMENTS.get("calculator")()
  row = {"a": 1234, "b": 5678}
  call = ('<tool_call>{"name": "calculator", "arguments": {"expression": "1234 * 5678"}}'
          '</tool_call>')
  trace, state = _episode(env, row, [call, "Answer: 7006652"])
  assert trace[1] == ([{"role": "tool", "name": "calculator", "content": "7006652"}], None,
                      False)
  assert trace[2] == ([], 1.0, True) and state["tool_calls"] == 1
  trace, _ = _episode(env, row, ["Answer: 7,006,653"])
  assert trace[1] == ([], 0.0, True)
  for garbled in ("Answer: ,", "Answer: -", "Answer: ,,7"):  # (a sampled turn can be anything)
    assert _episode(env, row, [garbled])[0][1] == ([], 0.0, True), garbled
  for decimal in ("Answer: 7006652.5", "Answer: 7,006,652.0", "Answer: 7006652e0"):  # not N
    assert _episode(env, row, [decimal])[0][1] == ([], 0.0, True), decimal
  assert _episode(env, row, ["Answer: 7006652."])[0][1] == ([], 1.0, True)  # a full stop
  trace, state = _episode(env, row, [call] * 5)  # never answers: max_turns ends it
  assert len(trace) == 4 and trace[-1][1:] == (0.0, True) and state["turn"] == 3
  no_tools = CalculatorEnv(tools=False)
  trace, state = _episode(no_tools, row, [call, "Answer: 7006652"])
  assert trace[1] == ([], 0.0, True) and state["tool_calls"] == 0  # a call is not an answer
  rows = calculator_rows(50, 4, seed=3)
  assert rows == calculator_rows(50, 4, seed=3)
  assert all(1000 <= r["a"] <= 9999 and 1000 <= r["b"] <= 9999 for r in rows)


class _JitteryCalculator(CalculatorEnv):
  """The calculator environment whose tool sleeps a random 0-50 ms per call."""

  def __init__(self, max_concurrency):
    super().__init__(max_concurrency=max_concurrency)
    rng = random.Random()

    def jittery(expression):
      time.sleep(rng.random() * 0.05)
      return CALCULATOR.function(expression)
    self._by_name = {"calculator": dataclasses.replace(CALCULATOR, function=jittery)}


def test_episodes_do_not_depend_on_tool_timing_or_concurrency():
  rows = calculator_rows(16, 4, seed=1)
  turns = [[f'<tool_call>{{"name": "calculator", "arguments": {{"expression": '
            f'"{r["a"]} * {r["b"]}"}}}}</tool_call>' for r in rows],
           [f"Answer: {r['a'] * r['b'] + (i % 3 == 0)}" for i, r in enumerate(rows)]]

  def play(concurrency):
    with EpisodeRunner(_JitteryCalculator(concurrency)) as runner:
      states = [s for s, _ in runner.reset(rows, list(range(16)))]
      out = []
      for t in turns:
        results = runner.step(states, t)
        out.append([(r.messages, r.reward, r.done) for r in results])
        states = [r.state for r in results]
      return out

  concurrent, sequential = play(16), play(1)
  assert concurrent == sequential
  rewards = np.array([r[1] for r in concurrent[1]])
  np.testing.assert_array_equal(rewards, [0.0 if i % 3 == 0 else 1.0 for i in range(16)])


def test_the_environment_adds_the_templates_delta_and_never_retokenises_the_assistant(
    tmp_path):
  from grpo_jax.envs.chat import environment_delta_ids, render  # noqa: PLC0415
  from tests.hf_fixtures import save_tiny_tokenizer  # noqa: PLC0415
  tok = save_tiny_tokenizer(tmp_path)
  env = CalculatorEnv()
  state, first = env.reset({"a": 1234, "b": 5678}, 0)
  prompt = tok.encode(render(tok, first, env.tools, add_generation_prompt=True))
  # The sampler's ids for the first turn, one token per character: the same text as BPE's
  # encoding of it, but other ids (a model may sample any spelling of a text).
  call = ('<tool_call>{"name": "calculator", "arguments": {"expression": "1234 * 5678"}}'
          '</tool_call>')
  sampled = [tok.convert_tokens_to_ids(t) for c in call for t in tok.tokenize(c)]
  sampled.append(tok.convert_tokens_to_ids("<|im_end|>"))
  text = tok.decode(sampled[:-1])
  assert text == call and tok.encode(text) != sampled[:-1]
  result = env.step(state, text)
  delta = environment_delta_ids(tok, first, text, result.messages, env.tools)
  episode = prompt + sampled + delta
  assert episode[len(prompt):len(prompt) + len(sampled)] == sampled  # the sampler's own ids
  assert tok.decode(delta) == ("\n<|im_start|>tool\n7006652<|im_end|>\n"
                               "<|im_start|>assistant\n")
  whole = render(tok, first + [{"role": "assistant", "content": text}] + result.messages,
                 env.tools, add_generation_prompt=True)
  assert tok.decode(episode) == whole  # the same text, but not the ids re-encoding gives:
  assert tok.encode(whole) != episode
  last_only = "{{ messages[-1]['content'] }}"
  tok.chat_template = last_only
  with pytest.raises(ValueError, match="renders the episode's earlier turns differently"):
    environment_delta_ids(tok, first, text, result.messages)


def test_a_template_that_trims_the_assistants_text_still_has_the_environments_delta(tmp_path):
  """Llama 3's template renders `message['content'] | trim`: a sampled turn ending in a newline
  renders without it, so `rendered(before) + text + end of turn` was not a prefix and the run
  stopped mid-training in a ValueError traceback. The delta now starts after the turn's end."""
  from grpo_jax.envs.chat import environment_delta_ids  # noqa: PLC0415
  from tests.hf_fixtures import save_tiny_tokenizer  # noqa: PLC0415
  tok = save_tiny_tokenizer(tmp_path)
  tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                       "{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  first, reply = [{"role": "user", "content": "1234 * 5678?"}], [{"role": "tool",
                                                                  "content": "7006652"}]
  plain = environment_delta_ids(tok, first, "call", reply)
  assert tok.decode(plain) == "\n<|im_start|>tool\n7006652<|im_end|>\n<|im_start|>assistant\n"
  assert environment_delta_ids(tok, first, " call\n", reply) == plain


TOOLS_TEMPLATE = (  # Qwen 2.5's way, shortened: the tools' JSON in the system turn
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for t in tools %}"
    "{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tools_reach_the_model_through_its_chat_template(tmp_path):
  import json  # noqa: PLC0415
  from grpo_jax.envs.chat import environment_delta_ids, render  # noqa: PLC0415
  from tests.hf_fixtures import save_tiny_tokenizer  # noqa: PLC0415
  tok = save_tiny_tokenizer(tmp_path)
  tok.chat_template = TOOLS_TEMPLATE
  env = CalculatorEnv()
  _, first = env.reset({"a": 12, "b": 34}, 0)
  text = render(tok, first, env.tools, add_generation_prompt=True)
  shown = json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0])
  assert shown == {"type": "function", "function": {
      "name": "calculator", "description": CALCULATOR.description,
      "parameters": CALCULATOR.parameters}}
  assert "<tools>" not in render(tok, first, (), add_generation_prompt=True)
  # The system turn stays where it is as turns follow: the delta is only the new messages.
  delta = environment_delta_ids(tok, first, "x", [{"role": "tool", "content": "408"}],
                                env.tools)
  assert tok.decode(delta) == "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"


def test_a_machine_that_cannot_isolate_refuses_the_python_tool(monkeypatch):
  """Where bubblewrap or user namespaces are missing the tool refuses to be made, in one
  sentence naming the cause and the field that accepts the risk; "unisolated" is made."""
  from grpo_jax.envs import sandbox  # noqa: PLC0415
  from grpo_jax.envs.builtin_tools import python_tool  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  monkeypatch.setattr(sandbox, "isolation_problem",
                      lambda: "bubblewrap (bwrap) is not installed; install it (apt-get ...)")
  with pytest.raises(ConfigError, match=r"^the python tool's sandbox cannot isolate its programs "
                     r"on this machine: bubblewrap \(bwrap\) is not installed; .* set "
                     r"env.sandbox='unisolated' \(no namespaces"):
    python_tool()
  assert python_tool("unisolated", timeout_s=3.0).timeout_s == 8.0
