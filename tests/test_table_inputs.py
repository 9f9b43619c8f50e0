"""The table task's rows read without a model (the character tokenizer): JSON that Python
cannot read, a CSV header naming a column twice, a column named like a reward function's
argument, and a held-out split that does not move when a row is skipped."""

import pytest

from tests.test_table import _rows, _write_jsonl


def _char_task(source, **data):
  """A table task on the character tokenizer (no model folder): the rows' handling alone."""
  from grpo_jax.data.table import TableTask, load_reward_functions  # noqa: PLC0415
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.envs.char_tokenizer import char_chat_tokenizer  # noqa: PLC0415
  config = get_defaults()
  config.data.update(dict(source=str(source), **data))
  config.reward.fns = "answer_number"
  return TableTask(config.data, char_chat_tokenizer(), load_reward_functions(config), 16,
                   lambda *_: None)


def test_json_that_python_cannot_read_and_a_column_named_twice_are_one_sentence(tmp_path):
  """A 5,000-digit integer (ValueError) or 100,000-deep nesting (RecursionError) is a bad row,
  as invalid JSON is; a .json file nested so deep, a CSV header naming a column twice (only the
  last was read), a column named like a reward function's argument: one InputError."""
  from grpo_jax.data.table_files import read_splits  # noqa: PLC0415
  from grpo_jax.errors import InputError  # noqa: PLC0415
  path, deep = tmp_path / "rows.jsonl", "[" * 100_000 + "]" * 100_000
  path.write_text('{"prompt": "a"}\n{"n": ' + "9" * 5000 + '}\n{"n": ' + deep + "}\n")
  (_, good), (_, big), (where, nested) = read_splits(str(path), "train", "test")[0]
  assert good == {"prompt": "a"} and where == f"{path}:3"
  assert str(big) == ("holds an integer of more than 4300 digits, past what Python reads; "
                      "write it as a string")
  assert str(nested) == "is nested too deeply to read; flatten its lists and objects"
  (tmp_path / "deep.json").write_text(deep)
  (tmp_path / "dup.csv").write_text("prompt,answer,answer\nWhat is 2+2?,4,5\n")
  _write_jsonl(tmp_path / "clash.jsonl", [{**r, "completions": 3} for r in _rows(10)])
  for name, said in [("deep.json", "is nested too deeply to read as .json; flatten its lists "
                                   "and objects."),
                     ("dup.csv", "names the column 'answer' twice in its header, so only the "
                                 "last would be read; rename or remove one of them."),
                     ("clash.jsonl", "has a column 'completions', the name of the reward "
                                     "functions' own argument; rename that column.")]:
    with pytest.raises(InputError) as e:
      _char_task(tmp_path / name)
    assert str(e.value) == f"{tmp_path / name} {said}"


def test_the_held_out_rows_do_not_move_when_a_row_is_skipped(tmp_path):
  """Drawn over the file's rows, skipped ones included: skipping row 0 (too long) keeps the
  held-out rows (before: [4, 10]); without skips they are what they always were."""
  rows = [{"prompt": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(20)]
  rows[0]["prompt"] += " pad" * 40
  _write_jsonl(tmp_path / "rows.jsonl", rows)
  for limit in (512, 100):
    task = _char_task(tmp_path / "rows.jsonl", max_prompt_tokens=limit, on_bad_row="skip")
    assert sorted(int(item[1]) // 2 for item in task.test) == [3, 9], limit
    assert len(task.train) == (18 if limit == 512 else 17)


def test_numbers_compare_exactly_and_a_number_cell_by_its_digits():
  """Past 2**53 float64 took 9007199254740993 for ...992, and 400-digit numbers were all inf; a
  number cell read from JSON (1e-05) was its text "1e-05", read as -5."""
  from grpo_jax.rewards.functions import answer_match, answer_number  # noqa: PLC0415
  from grpo_jax.rewards.gsm8k import normalize_number  # noqa: PLC0415
  completions = ["9007199254740992", "2" * 400, "0.00001", "-5", "1.5e3", "it is 20000000000000000"]
  answers = ["9007199254740993", "1" * 400, 1e-05, 1e-05, 1500, 2e16]
  assert answer_number(None, completions, answers=answers) == [0.0, 0.0, 1.0, 0.0, 1.0, 1.0]
  assert [answer_match(c, a) for c, a in zip(completions, answers)] == [0, 0, 1, 0, 1, 1]
  assert normalize_number("9007199254740993") == "9007199254740993"
  assert [normalize_number(t) for t in ("$18.00", "-3.50", "0.10", "1,234")] == [
      "18", "-3.5", "0.1", "1234"]
