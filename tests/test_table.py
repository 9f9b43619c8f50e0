"""A researcher's own data and reward from config alone (task "table", reward.fns): the README's
"Bring your own data and reward" section run as written from a folder outside the repository,
the same rows as Parquet and as a save_to_disk folder, a hub id offline, and each bad row and
bad reward function ending in one sentence (exit status 2, nothing written to the workdir)."""

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from tests.hf_fixtures import save_tiny_qwen2
from tests.test_bad_inputs import _expect

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "configs", "grpo_table.py")
TINY_MODEL = ["--config.train.eval_size=20", "--config.train.eval_batch_size=20",
              "--config.rollout.max_new_tokens=16", "--config.optim.learning_rate=3e-3",
              "--config.optim.warmup_steps=0", "--config.train.num_samples=1"]


def _readme_section() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  start = text.index("## Bring your own data and reward")
  return text[start:text.index("\n## ", start + 1)]


def _rows(count=200, seed=0):
  """Rows shaped like the README's JSON line: a messages list and an answer."""
  rng = random.Random(seed)
  rows = []
  for _ in range(count):
    a, b = rng.randrange(50), rng.randrange(50)
    rows.append({"messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
                 "answer": str(a + b)})
  return rows


def _write_jsonl(path, rows):
  with open(path, "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return save_tiny_qwen2(str(tmp_path_factory.mktemp("tiny_qwen2")))


def test_the_readmes_own_data_and_reward_learn_from_outside_the_repository(tmp_path, model_dir):
  section = _readme_section()
  example = json.loads(re.search(r"```json\n(.*?)\n```", section, re.S).group(1))
  assert set(example) == set(_rows(1)[0]) and example["messages"][0]["role"] == "user"
  module = re.search(r"```python\n# my_rewards.py\n(.*?)```", section, re.S).group(1)
  command = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
  project = tmp_path / "my_project"  # outside the repository, as the README's `cd`
  project.mkdir()
  (project / "my_rewards.py").write_text(module)
  _write_jsonl(project / "my_data.jsonl", _rows())
  line = " ".join(command.replace("\\\n", " ").splitlines()[1:])  # after the `cd` line
  env_part, _, rest = line.partition(" python ")
  assert env_part == "PYTHONPATH=."
  argv = shlex.split(rest.replace("$REPO", ROOT))
  env = dict(os.environ, PYTHONPATH=str(project))
  out = subprocess.run([sys.executable, *argv, f"--config.model.path={model_dir}",
                        "--config.train.steps=30", "--config.train.eval_every=30", *TINY_MODEL],
                       cwd=project, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  with open(project / "runs" / "mine" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  rewards = [r["reward_mean"] for r in records if "reward_mean" in r]
  digits = [r["reward/digit_share_mean"] if "reward/digit_share_mean" in r else None
            for r in records]
  first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
  print(f"reward_mean first 5 steps {first:.3f}, last 5 {last:.3f}")
  assert last > first + 0.15, (first, last, digits)
  evals = [r for r in records if "eval_accuracy" in r]
  assert {"eval_digit_share", "eval_answer_number"} <= set(evals[-1])


def _task(source, model_dir, **data):
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  config = get_defaults()
  config.task.name = "table"
  config.model.path = model_dir
  config.warmup.steps = 0
  config.data.update(dict(source=str(source), max_prompt_tokens=64, **data))
  config.reward.fns = "answer_number"
  return build_task(config, log=lambda *_: None)


def test_parquet_and_save_to_disk_give_the_jsonl_task(tmp_path, model_dir):
  """The same rows as JSONL, Parquet and a save_to_disk folder make the same task: the same
  training and held-out prompts, columns and rewards (so the same run)."""
  import datasets  # noqa: PLC0415
  rows = _rows(60)
  _write_jsonl(tmp_path / "rows.jsonl", rows)
  table = datasets.Dataset.from_list(rows)
  table.to_parquet(str(tmp_path / "rows.parquet"))
  table.save_to_disk(str(tmp_path / "saved"))
  tasks = [_task(tmp_path / name, model_dir) for name in ("rows.jsonl", "rows.parquet", "saved")]
  assert len(tasks[0].train) == 54 and len(tasks[0].test) == 6  # test_fraction 0.1
  for task in tasks[1:]:
    assert task.train == tasks[0].train and task.test == tasks[0].test
  batch = tasks[0].train_batch(7, 4, seed=3)
  for task in tasks[1:]:
    other = task.train_batch(7, 4, seed=3)
    np.testing.assert_array_equal(other.prompt_tokens, batch.prompt_tokens)
  tokenizer = tasks[0].tokenizer
  answer = tokenizer(batch.gold[0] + " is it", add_special_tokens=False)["input_ids"]
  tokens = np.zeros((4, len(answer)), np.int32)
  tokens[0] = answer
  mask = np.zeros_like(tokens, bool)
  mask[0] = True
  np.testing.assert_array_equal(tasks[2].score(batch, tokens, mask, 1), [1.0, 0.0, 0.0, 0.0])


def test_a_folder_with_a_test_split_and_a_system_prompt(tmp_path, model_dir):
  rows = _rows(30)
  (tmp_path / "data").mkdir()
  _write_jsonl(tmp_path / "data" / "train.jsonl", rows[:20])
  with open(tmp_path / "data" / "test.csv", "w") as f:
    f.write("prompt,answer\n" + "".join(f"What is {i} + 1?,{i + 1}\n" for i in range(10)))
  task = _task(tmp_path / "data", model_dir, system_prompt="Be brief.")
  assert len(task.train) == 20 and len(task.test) == 10
  text = task.tokenizer.decode(task.test[3][0])
  assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 3 + 1?")
  assert task.test[3][1] == "4" and task.test[3][2] == "What is 3 + 1?"


def test_a_hub_id_offline_is_one_sentence(tmp_path, model_dir, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  import datasets  # noqa: PLC0415
  import huggingface_hub.constants  # noqa: PLC0415
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  from grpo_jax.errors import InputError  # noqa: PLC0415
  with pytest.raises(InputError, match=r"^data.source='someone/no-such-set' is not a local file "
                     r"or folder, and loading it as a datasets hub id failed \(.*\); check"):
    _task("someone/no-such-set", model_dir)


BAD_ROWS = [
    (b'{"prompt": "fine", "answer": "1"}\n\xff\xfe{"prompt": "x"}\n', "rows.jsonl:2 is not UTF-8"),
    (b'{"prompt": "fine"}\n{"prompt": "a",\n', "rows.jsonl:2 is not valid JSON"),
    (b'{"prompt": "fine"}\n{"question": "a"}\n', "rows.jsonl:2 has no prompt"),
    (b'{"prompt": "fine"}\n{"prompt": "   "}\n', "rows.jsonl:2 has an empty prompt"),
    (b'{"prompt": "fine"}\n{"prompt": "' + b"many words " * 80 + b'"}\n',
     "rows.jsonl:2 has a prompt of"),
    (b'{"prompt": "fine"}\n{"messages": [{"role": "user", "content": "\\udc80 a"}]}\n',
     "rows.jsonl:2 has text that is not valid Unicode in messages[0].content"),
]


@pytest.mark.parametrize("content,needle", BAD_ROWS, ids=["utf8", "json", "no_prompt", "empty",
                                                           "too_long", "lone_surrogate"])
def test_a_bad_row_is_one_sentence_or_skipped(tmp_path, capfd, model_dir, content, needle):
  data = tmp_path / "rows.jsonl"
  data.write_bytes(content + b'{"prompt": "also fine", "answer": "1"}\n' * 20)
  workdir = tmp_path / "run"
  workdir.mkdir()
  argv = [f"--config={RECIPE}", f"--config.model.path={model_dir}", f"--config.data.source={data}",
          "--config.reward.fns=answer_number", "--config.data.max_prompt_tokens=64"]
  line = _expect(capfd, argv, str(workdir), needle, "data.on_bad_row='skip'")
  assert str(data) in line
  task = _task(data, model_dir, on_bad_row="skip")
  assert len(task.train) + len(task.test) == 21  # the bad row skipped, the rest kept


def _reward_module(tmp_path, body: str) -> str:
  (tmp_path / "bad_rewards.py").write_text(body)
  return str(tmp_path / "bad_rewards.py")


BAD_REWARDS = [
    ("def score(prompts, completions, **c):\n  return [1 / 0 for _ in completions]\n",
     ("reward function", "raised ZeroDivisionError")),
    ("def score(prompts, completions, **c):\n  return [1.0, 2.0] + [0.0] * len(completions)\n",
     ("returned 4 values for 2 completions", "probe call")),
    ("def score(prompts, completions, **c):\n  return [float('nan')] * len(completions)\n",
     ("returned nan",)),
    ("def other(prompts, completions, **c):\n  return [0.0] * len(completions)\n",
     ("has no function 'score'",)),
    ("import no_such_module_here\n", ("importing", "ModuleNotFoundError")),
    ("import sys\ndef score(prompts, completions, **c):\n  sys.exit(0)\n",
     ("called sys.exit(0)",)),
    ("def score(prompts, completions, **c):\n  return None\n", ("returned None",)),
    ("def score(prompts, completions, **c):\n  n = len(completions)\n  completions.clear()\n"
     "  return [0.0] * len(completions)\n", ("returned 0 values for 2 completions",)),
    ("import sys\nsys.exit(0)\n", ("importing", "SystemExit: 0")),
    ("def score(prompts, completions, **c):\n"  # right for one completion only (round 5)
     "  return [0.5] if len(completions) > 1 else [0.0] * len(completions)\n",
     ("returned 1 values for 2 completions", "on a probe call")),
]


@pytest.mark.parametrize("body,needles", BAD_REWARDS, ids=["raises", "count", "nan", "missing",
                                                             "import", "exit", "none", "mutates",
                                                             "exit_on_import", "short_batch"])
def test_a_bad_reward_function_is_named_in_one_sentence(tmp_path, capfd, model_dir, body,
                                                        needles):
  data = tmp_path / "rows.jsonl"
  _write_jsonl(data, _rows(20))
  path = _reward_module(tmp_path, body)
  workdir = tmp_path / "run"
  workdir.mkdir()
  argv = [f"--config={RECIPE}", f"--config.model.path={model_dir}", f"--config.data.source={data}",
          f"--config.reward.fns={path}:score"]
  _expect(capfd, argv, str(workdir), f"{path}:score", *needles)


@pytest.mark.parametrize("column", [None, "Answer"], ids=["none", "misnamed"])
def test_a_built_in_reward_without_its_answer_column_is_one_sentence(tmp_path, capfd, model_dir,
                                                                     column):
  data = tmp_path / "rows.jsonl"
  rows = [{"prompt": r["messages"][0]["content"], **({column: r["answer"]} if column else {})}
          for r in _rows(20)]
  _write_jsonl(data, rows)
  workdir = tmp_path / "run"
  workdir.mkdir()
  argv = [f"--config={RECIPE}", f"--config.model.path={model_dir}", f"--config.data.source={data}",
          "--config.reward.fns=answer_number"]
  _expect(capfd, argv, str(workdir), "reward.fns names answer_number",
          "data.answer_field='answer'", "set data.answer_field")


def test_a_module_that_cannot_be_imported_names_pythonpath(tmp_path, capfd, model_dir):
  data = tmp_path / "rows.jsonl"
  _write_jsonl(data, _rows(20))
  workdir = tmp_path / "run"
  workdir.mkdir()
  argv = [f"--config={RECIPE}", f"--config.model.path={model_dir}", f"--config.data.source={data}",
          "--config.reward.fns=not_on_the_path:score"]
  _expect(capfd, argv, str(workdir), "reward.fns[0]='not_on_the_path:score'", "PYTHONPATH")


def test_built_in_rewards():
  from grpo_jax.rewards.functions import answer_number, format_regex, math_verify  # noqa
  completions = ["so it is 1/2", "0.5", "\\frac{1}{2}", "it is 2", "#### 42"]
  answers = ["0.5"] * 4 + ["42"]
  assert math_verify(None, completions, answers=answers) == [1.0, 1.0, 1.0, 0.0, 1.0]
  assert answer_number(None, completions, answers=answers) == [0.0, 1.0, 0.0, 0.0, 1.0]
  assert format_regex(None, completions, pattern=r"#### -?\d+") == [0.0] * 4 + [1.0]


def test_numbers_without_a_leading_digit_read_as_their_value():
  from grpo_jax.rewards.functions import answer_match, answer_number  # noqa: PLC0415
  completions = ["0.5", "5", "-0.5", "-5", "3.98", "1234.5", "it is 5."]
  answers = [".5", ".5", "-.5", "-.5", "3.98", "1,234.5", "5"]
  assert answer_number(None, completions, answers=answers) == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
  assert [answer_match(c, a) for c, a in zip(completions, answers)] == [1.0, 0.0, 1.0, 0.0, 1.0,
                                                                         1.0, 1.0]


def test_a_file_saved_with_a_utf8_bom_reads_as_the_same_rows(tmp_path):
  """Excel's "CSV UTF-8" (and some editors) start the file with a byte-order mark."""
  from grpo_jax.data.table_files import read_splits  # noqa: PLC0415
  row = {"prompt": "What is 2+2?", "answer": "4"}
  texts = {".csv": "prompt,answer\nWhat is 2+2?,4\n", ".jsonl": json.dumps(row) + "\n",
           ".json": json.dumps([row])}
  for ext, text in texts.items():
    path = tmp_path / f"rows{ext}"
    path.write_text(text, encoding="utf-8-sig")
    assert [r for _, r in read_splits(str(path), "train", "test")[0]] == [row], ext


@pytest.mark.parametrize("fns,clash", [("mine:accuracy,answer_number", "eval_accuracy"),
                                       ("mine:reward,answer_number", "eval_reward"),
                                       ("mine:score,other.py:score", "eval_score"),
                                       # the evaluator's own (train/run/evaluation.py)
                                       ("mine:reward_errors,answer_number",
                                        "eval_reward_errors"),
                                       ("mine:pass_at_2,answer_number", "eval_pass_at_2")])
def test_reward_functions_whose_metrics_collide_are_one_sentence(fns, clash):
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from grpo_jax.rewards import functions  # noqa: PLC0415
  config = get_defaults()
  config.reward.fns = fns
  found = lambda *_: types.SimpleNamespace(accuracy=len, reward=len, score=len,  # noqa: E731
                                          reward_errors=len, pass_at_2=len)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(functions, "_import_module", found)
    with pytest.raises(ConfigError, match=f"would log the held-out metric.s. {clash} twice") as e:
      functions.load_reward_functions(config)
    assert "rename the function" in str(e.value) and "\n" not in str(e.value)
    config.reward.fns = "mine:score,answer_number,answer_number"  # a spec twice: accepted
    assert len(functions.load_reward_functions(config)) == 3


@pytest.mark.parametrize("fns,field,value,message", [
    ("answer_number", "fn_weights", "nan", "reward.fn_weights='nan'; give comma-separated finite"),
    ("answer_number,answer_number", "fn_weights", "1,inf", "reward.fn_weights='1,inf'; give"),
    ("answer_number", "timeout_s", float("inf"), "reward.timeout_s=inf; give the seconds"),
    ("answer_number", "timeout_s", 1e10, "reward.timeout_s=10000000000.0; give the seconds"),
])
def test_a_weight_or_time_limit_out_of_range_is_one_sentence(fns, field, value, message):
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from grpo_jax.rewards.functions import load_reward_functions  # noqa: PLC0415
  config = get_defaults()
  config.reward.fns, config.reward[field] = fns, value
  with pytest.raises(ConfigError, match=None) as e:
    load_reward_functions(config)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)
  if field == "timeout_s":
    assert "at most 1e+06" in str(e.value)
  config.reward.fn_weights, config.reward.timeout_s = ",".join(["0.5"] * len(fns.split(","))), 1e6
  assert [f.weight for f in load_reward_functions(config)] == [0.5] * len(fns.split(","))


def test_reward_fns_with_another_task_is_one_sentence():
  from grpo_jax.config import ConfigError, validate  # noqa: PLC0415
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  config = get_defaults()
  config.reward.fns = "answer_number"
  with pytest.raises(ConfigError, match=r"^reward.fns='answer_number' scores the rows of "
                     r"task.name='table'"):
    validate(config)


def test_a_missing_file_is_one_sentence(tmp_path, model_dir):
  from grpo_jax.errors import InputError  # noqa: PLC0415
  with pytest.raises(InputError, match=r"^data.source='.*nope.jsonl' does not exist"):
    _task(tmp_path / "nope.jsonl", model_dir)


def test_sigterm_during_a_hung_reward_function_saves_and_stops_within_seconds(tmp_path,
                                                                               model_dir):
  """round4 F14: a reward function that blocks on its 3rd call; SIGTERM then ends the run in
  seconds with the last completed step saved (exit 143), and the same command resumes."""
  data = tmp_path / "rows.jsonl"
  _write_jsonl(data, _rows(40))
  marker = tmp_path / "sleeping"
  (tmp_path / "hangs.py").write_text(
      "import os, time\ncalls = [0]\n"
      "def score(prompts, completions, **c):\n  calls[0] += 1\n"
      "  if calls[0] == 4:  # the probe, step 0's evaluation, step 1, then step 2 hangs\n"
      f"    open({str(marker)!r}, 'w').close()\n    time.sleep(3600)\n"
      "  return [0.0] * len(completions)\n")
  workdir = tmp_path / "run"
  argv = [sys.executable, "-m", "grpo_jax.main", f"--config={RECIPE}", f"--workdir={workdir}",
          f"--config.model.path={model_dir}", f"--config.data.source={data}",
          f"--config.reward.fns={tmp_path / 'hangs.py'}:score", "--config.train.steps=4",
          "--config.train.eval_every=10", "--config.train.eval_size=4",
          "--config.train.eval_batch_size=4", "--config.rollout.max_new_tokens=8",
          "--config.train.num_samples=0"]
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  deadline = time.time() + 600
  while not marker.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.2)
  assert marker.exists(), proc.communicate()[1][-3000:]
  proc.send_signal(signal.SIGTERM)
  sent = time.time()
  out, err = proc.communicate(timeout=60)
  assert time.time() - sent < 20 and proc.returncode == 143, err[-3000:]
  assert "SIGTERM: stopped while waiting on the host" in err
  assert f"saved checkpoint {workdir}/checkpoints/1" in err
  assert sorted(os.listdir(workdir / "checkpoints")) == ["0", "1"]


def test_a_small_file_is_evaluated_whole_with_a_line(tmp_path, model_dir):
  """round4/issue 58: the recipe's eval_size=100 on a 40-row file (4 held out)."""
  data = tmp_path / "rows.jsonl"
  _write_jsonl(data, _rows(40))
  lines = []
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  config = get_defaults()
  config.task.name = "table"
  config.model.path = model_dir
  config.data.update(dict(source=str(data), max_prompt_tokens=64, fit_eval_size=True))
  config.reward.fns = "answer_number"
  task = build_task(config, log=lines.append)
  assert len(task.test_batch(100).prompt_tokens) == 4
  assert lines[-1] == ("table: train.eval_size=100 but 4 held-out prompts: each evaluation "
                       "scores those 4 (data.fit_eval_size)")
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  config.data.fit_eval_size = False
  with pytest.raises(ConfigError, match="train.eval_size=100 exceeds the 4 held-out prompts"):
    build_task(config, log=lines.append).test_batch(100)
  # eval_accuracy is the answer's match, eval_reward the weighted reward
  batch = task.test_batch(4)
  ids = [task.tokenizer.encode(text) for text in ["the answer is " + r["answer"] for r in
                                                   batch.columns[:2]] + ["no", "nothing"]]
  width = max(map(len, ids))
  tokens = np.asarray([i + [0] * (width - len(i)) for i in ids])
  mask = np.asarray([[1] * len(i) + [0] * (width - len(i)) for i in ids], bool)
  scores = task.eval_scores(batch, tokens, mask)
  assert scores["eval_accuracy"].tolist() == [1.0, 1.0, 0.0, 0.0]
  assert scores["eval_reward"].tolist() == [1.0, 1.0, 0.0, 0.0]
