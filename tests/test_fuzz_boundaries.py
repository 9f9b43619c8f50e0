"""Generated inputs at every boundary where the outside world enters (issue 77): each property
says the boundary either accepts the input (a value of the expected shape) or refuses it with
the project's own one-sentence error, and never raises anything else.

    boundary            entry point                                      its own refusal
    data rows           table_files.read_splits (.jsonl, .json, .csv,    BadRow, InputError
                        .parquet), TableTask._messages (odd Unicode,
                        wrong types, missing fields, huge and empty
                        values)
    tool-call text      each parser of envs/parsers.py                   ParseFailure (returned)
    tool calls          envs/tools.call_tools on the calculator          a "tool" message
    environment steps   envs.check_step_result (what take_result reads)  InputError
    reward outputs      rewards/functions.call_reward                    ValueError / RuntimeError
                                                                         naming the function
    remote answers      rewards/remote._rewards_field / _decode;         their _Fault /
                        rewards/remote_teacher.read_logprobs             RemoteFault
    images              data/images.decode_image                         ImageLoadError
    sweep grids         sweep/spec.load_sweep                            SweepError

The CI profile ("ci", the default) draws FUZZ_EXAMPLES examples per boundary (200),
derandomised so that every CI run draws the same ones; `GRPO_JAX_FUZZ=long` (or
benchmarks/fuzz_boundaries.py) draws 10,000 per boundary, its counts in RESULTS.
"""

import io
import json
import math
import os
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_jax.data import table_files
from grpo_jax.data.images import ImageLoadError, decode_image, png_bytes
from grpo_jax.data.table_files import BadRow
from grpo_jax.envs.builtin_tools import CALCULATOR
from grpo_jax.envs.parsers import MAX_CALLS_PER_TURN, TOOL_CALL_PARSERS, ParseFailure, ToolCall
from grpo_jax.envs.tools import ToolPool, call_tools
from grpo_jax.errors import InputError
from grpo_jax.rewards import remote
from grpo_jax.rewards.functions import RewardFunction, call_reward
from grpo_jax.sweep.spec import SweepError, load_sweep

LONG = os.environ.get("GRPO_JAX_FUZZ") == "long"
FUZZ_EXAMPLES = 10_000 if LONG else 200
settings.register_profile("grpo_jax", max_examples=FUZZ_EXAMPLES, derandomize=not LONG,
                          deadline=None, database=None, print_blob=True,
                          suppress_health_check=list(HealthCheck))
settings.load_profile("grpo_jax")

# Text as a policy or a data file may hold it: any code point, lone surrogates included.
TEXT = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=80)
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                      TEXT, st.sampled_from(["", " ", "\udc80", "🙂", "a" * 5000]))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
ROW = st.dictionaries(st.sampled_from(["prompt", "messages", "answer", "role", "content",
                                       "images", "x"]), JSON_VALUE, max_size=4)
MESSAGES_ROW = st.fixed_dictionaries({"messages": st.lists(st.one_of(
    JSON_VALUE, st.fixed_dictionaries({"role": JSON_VALUE, "content": JSON_VALUE})),
    max_size=4)})


def _task_stub():
  data = types.SimpleNamespace(prompt_field="prompt", instruction="", system_prompt="")
  return types.SimpleNamespace(data=data)


@given(st.lists(st.one_of(ROW, MESSAGES_ROW, JSON_VALUE), max_size=5),
       st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]))
def test_data_rows_are_rows_or_one_sentence(tmp_path_factory, rows, ext):
  from grpo_jax.data.table import TableTask  # noqa: PLC0415
  folder = tmp_path_factory.mktemp("rows")
  path = str(folder / f"train{ext}")
  if ext == ".csv":  # the rows' values as cells, odd text and missing cells included
    lines = [",".join(json.dumps(v) if not isinstance(v, str) else v
                      for v in (r.values() if isinstance(r, dict) else [r])) for r in rows]
    with open(path, "w", encoding="utf-8", errors="replace") as f:
      f.write("prompt,answer\n" + "\n".join(lines) + "\n")
  elif ext == ".parquet":
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    texts = [json.dumps(r).encode("utf-8", "replace").decode("utf-8") for r in rows]
    pq.write_table(pa.table({"prompt": texts, "answer": [str(len(t)) for t in texts]}), path)
  else:
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
      if ext == ".jsonl":
        f.write("".join(json.dumps(r) + "\n" for r in rows))
      else:
        json.dump(rows, f)
  try:
    read, _ = table_files.read_splits(path, "train", "test")
  except InputError:
    return
  stub = _task_stub()
  for where, row in read:
    assert where.startswith(path)
    if isinstance(row, BadRow):
      continue
    assert isinstance(row, dict)
    try:
      messages = TableTask._messages(stub, row)
    except BadRow:
      continue
    assert messages and all(isinstance(m["content"], str) for m in messages)
    for m in messages:
      m["content"].encode("utf-8")  # every accepted text can be tokenized


@given(TEXT | st.builds(lambda parts: "".join(parts), st.lists(st.sampled_from(
    ["<tool_call>", "</tool_call>", "{", "}", "[", "]", "(", ")", '"name"', ": ", ", ",
     '"arguments"', "calculator", "expression=", "'1+1'", "\\", "\udc80", "x" * 50]),
    max_size=60)))
def test_tool_call_text_is_calls_or_parse_failures(text):
  for name in TOOL_CALL_PARSERS.names():
    calls = TOOL_CALL_PARSERS.get(name)(text)
    assert isinstance(calls, list) and len(calls) <= MAX_CALLS_PER_TURN + 1
    assert all(isinstance(c, (ToolCall, ParseFailure)) for c in calls)
    assert all(isinstance(c.arguments, dict) for c in calls if isinstance(c, ToolCall))


_POOL = ToolPool(4)


@given(st.lists(st.one_of(
    st.builds(ToolCall, st.sampled_from(["calculator", "calc", "", "\udc80"]),
              st.dictionaries(st.sampled_from(["expression", "x"]), JSON_VALUE, max_size=2)),
    st.builds(ParseFailure, TEXT, TEXT)), max_size=4))
def test_tool_calls_always_come_back_as_tool_messages(calls):
  outcomes = call_tools(calls, {"calculator": CALCULATOR}, _POOL)
  assert len(outcomes) == len(calls)
  for outcome in outcomes:
    assert outcome.message["role"] == "tool"
    outcome.message["content"].encode("utf-8")  # every message can be tokenized


@given(st.one_of(
    JSON_VALUE,
    st.tuples(JSON_VALUE, st.lists(st.one_of(JSON_VALUE, st.fixed_dictionaries(
        {"role": st.sampled_from(["tool", "user", 1]), "content": JSON_VALUE})), max_size=3),
        st.one_of(st.none(), st.floats(allow_nan=True), st.integers(), st.booleans(), TEXT),
        st.one_of(st.booleans(), st.none(), st.integers(), TEXT))))
def test_environment_steps_are_step_results_or_one_sentence(result):
  from grpo_jax.envs import StepResult, check_step_result  # noqa: PLC0415
  env = types.SimpleNamespace()
  try:
    checked = check_step_result(result, env)
  except InputError as e:
    assert str(e).startswith("the environment SimpleNamespace's step returned ")
    return
  assert isinstance(checked, StepResult) and isinstance(checked.done, (bool, np.bool_))
  assert checked.reward is None or math.isfinite(float(checked.reward))
  for m in checked.messages:
    m["content"].encode("utf-8")


@given(st.one_of(
    JSON_VALUE,
    st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                       st.none(), st.booleans(), TEXT), min_size=0, max_size=5),
    st.builds(lambda n, v: np.full(n, v), st.integers(0, 5),
              st.floats(allow_nan=True, allow_infinity=True))),
    st.integers(1, 4))
def test_reward_outputs_are_finite_values_or_a_sentence_naming_the_function(output, count):
  reward = RewardFunction("my_rewards.py:score", lambda prompts, completions, **c: output, 1.0)
  try:
    values = call_reward(reward, ["p"] * count, ["c"] * count, {})
  except (ValueError, RuntimeError) as e:
    assert str(e).startswith("reward function 'my_rewards.py:score' "), str(e)
    return
  assert values.shape == (count,) and np.isfinite(values).all()


@given(st.one_of(st.binary(max_size=200), JSON_VALUE.map(
    lambda v: json.dumps(v).encode("utf-8", "surrogatepass"))), st.integers(1, 4))
def test_remote_reward_answers_are_rewards_or_a_fault(body, rows):
  try:
    values = remote._rewards_field(remote._decode(body), rows, 0)
  except remote._Fault:
    return
  assert len(values) == rows and all(isinstance(v, float) for v in values)


@given(st.one_of(JSON_VALUE, st.fixed_dictionaries({"logprobs": st.lists(st.one_of(
    JSON_VALUE, st.lists(st.one_of(st.floats(allow_nan=True), st.integers(), TEXT, st.none()),
                         max_size=4)), max_size=3)})),
    st.lists(st.lists(st.integers(0, 50), max_size=4), min_size=1, max_size=3))
@example({"logprobs": [[-10 ** 400, 10 ** 400]]}, [[1, 2]])  # ints beyond float's range
@example({"logprobs": [[-10 ** 400]]}, [[1]])
def test_remote_teacher_answers_are_logprobs_or_a_fault(payload, completion_ids):
  from grpo_jax.rewards.remote_teacher import RemoteFault, read_logprobs  # noqa: PLC0415
  try:
    rows = read_logprobs(payload, completion_ids, 0)
  except RemoteFault:
    return
  assert [len(r) for r in rows] == [len(ids) for ids in completion_ids]
  assert all(isinstance(v, float) and not v > 1e-3 for r in rows for v in r)


_GOOD_PNG = png_bytes(np.zeros((4, 4, 3), np.uint8))


@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda cut, tail: _GOOD_PNG[:cut] + tail,
                           st.integers(0, len(_GOOD_PNG)), st.binary(max_size=20)),
                 st.builds(lambda mode, w, h: _pil_bytes(mode, w, h),
                           st.sampled_from(["1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I",
                                            "F", "CMYK"]),
                           st.integers(1, 8), st.integers(1, 8))))
def test_image_bytes_are_an_rgb_image_or_one_sentence(data):
  try:
    image = decode_image(data, "under test")
  except ImageLoadError as e:
    assert str(e).startswith("image under test ")
    return
  assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3


def _pil_bytes(mode: str, width: int, height: int) -> bytes:
  from PIL import Image  # noqa: PLC0415
  out = io.BytesIO()
  image = Image.new(mode, (width, height))
  image.save(out, "TIFF" if mode in ("F", "CMYK", "I") else "PNG")
  return out.getvalue()


@given(st.dictionaries(st.sampled_from(["rl.advantage", "rl.kl_coef", "recipe", "x", ""]),
                       JSON_VALUE, max_size=3),
       st.one_of(st.none(), JSON_VALUE), st.one_of(st.none(), JSON_VALUE))
def test_sweep_grids_are_arms_or_one_sentence(tmp_path_factory, grid, seeds, overrides):
  fields = {"base_config": "configs/grpo_tiny.py", "grid": grid}
  if seeds is not None:
    fields["seeds"] = seeds
  if overrides is not None:
    fields["arm_overrides"] = overrides
  path = tmp_path_factory.mktemp("sweep") / "fuzz.py"
  path.write_text(f"def get_sweep():\n  return {fields!r}\n", encoding="utf-8",
                  errors="surrogatepass")
  try:
    sweep = load_sweep(str(path))
  except SweepError:
    return
  assert sweep.arms and all(isinstance(a.overrides, dict) for a in sweep.arms)


def test_the_profile_draws_its_examples():
  """The counts RESULTS gives are the profile's (a changed profile is a changed claim)."""
  assert settings().max_examples == FUZZ_EXAMPLES and (LONG or settings().derandomize)
