"""Bad inputs as a new user gives them: config fields, data files, model folders, tokenizers,
workdirs and command lines. Each goes through the command line in this process
(`grpo_jax.main.cli`, what `python -m grpo_jax.main` runs) and must end with exit status 2,
exactly one line on stderr naming the offending field, file or value, and nothing written to
the workdir. A few go through a real `python -m grpo_jax.main` process too. Bad model folders
are in tests/test_bad_model_folders.py (which imports this file's helpers and fixture)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from grpo_jax.main import cli
from tests.hf_fixtures import save_tiny_qwen2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "grpo_tiny.py")
GSM8K = os.path.join(ROOT, "configs", "grpo_gsm8k.py")
EXCERPT = os.path.join(ROOT, "tests", "data", "gsm8k")
GSM8K_SMALL = ["--config.rollout.num_prompts=2", "--config.rollout.group_size=2",
               "--config.rollout.max_new_tokens=12", "--config.data.max_prompt_tokens=200",
               "--config.rl.num_minibatches=2", "--config.rl.num_micro_batches=1",
               "--config.train.eval_size=3", "--config.train.eval_batch_size=3"]


def _expect(capfd, argv, workdir, *needles, entry=None):
  """Runs argv; asserts exit 2, one stderr line holding every needle, nothing written."""
  before = sorted(os.listdir(workdir)) if workdir and os.path.isdir(workdir) else None
  code = cli([f"--workdir={workdir}", *argv] if workdir is not None else argv, entry)
  err = capfd.readouterr().err
  lines = err.strip().splitlines()
  assert code == 2, err
  assert len(lines) == 1 and lines[0].startswith("error: "), err
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  after = sorted(os.listdir(workdir)) if workdir and os.path.isdir(workdir) else None
  assert after == before, f"the workdir changed: {before} -> {after}"
  return lines[0]


# ----------------------------------------------------------------------------- config fields

CONFIG_CASES = [
    ("optim.learning_rate=inf", "optim.learning_rate=inf"),
    ("optim.learning_rate=nan", "optim.learning_rate=nan"),
    ("optim.learning_rate=0", "optim.learning_rate=0"),
    ("optim.learning_rate=-0.001", "optim.learning_rate=-0.001"),
    ("optim.max_grad_norm=0", "optim.max_grad_norm=0"),
    ("optim.b1=1.0", "optim.b1=1.0"),
    ("optim.b2=1.5", "optim.b2=1.5"),
    ("optim.weight_decay=-0.1", "optim.weight_decay=-0.1"),
    ("warmup.steps=-1", "warmup.steps=-1"),
    ("warmup.learning_rate=-1.0", "warmup.learning_rate=-1.0"),
    ("warmup.learning_rate=inf", "warmup.learning_rate=inf"),
    ("warmup.batch_size=0", "warmup.batch_size=0"),
    ("model.num_layers=0", "model.num_layers=0"),
    ("model.head_dim=0", "model.head_dim=0"),
    ("model.num_heads=0", "model.num_heads=0"),
    ("model.num_kv_heads=0", "model.num_kv_heads=0"),
    ("model.num_kv_heads=3", "model.num_kv_heads=3"),
    ("model.hidden_size=-8", "model.hidden_size=-8"),
    ("model.vocab_size=5", "model.vocab_size=5"),
    ("model.compute_dtype=float8", "model.compute_dtype='float8'"),
    ("model.param_dtype=int8", "model.param_dtype='int8'"),
    ("model.remat=sometimes", "model.remat='sometimes'"),
    ("model.logits_chunk=-4", "model.logits_chunk=-4"),
    ("rollout.temperature=0", "rollout.temperature=0"),
    ("rollout.temperature=-1", "rollout.temperature=-1"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens=0"),
    ("rollout.group_size=1", "rollout.group_size=1"),
    ("rollout.num_prompts=0", "rollout.num_prompts=0"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5"),
    ("rollout.top_k=-1", "rollout.top_k=-1"),
    ("rollout.decode_slots=-2", "rollout.decode_slots=-2"),
    ("rollout.decode_block=-1", "rollout.decode_block=-1"),
    ("train.steps=0", "train.steps=0"),
    ("train.eval_every=0", "train.eval_every=0"),
    ("train.eval_size=100000", "train.eval_size=100000"),
    ("train.eval_pass_k=-2", "train.eval_pass_k=-2"),
    ("train.keep_checkpoints=0", "train.keep_checkpoints=0"),
    ("train.on_reward_error=ignore", "train.on_reward_error='ignore'"),
    ("train.max_reward_error_fraction=2.0", "train.max_reward_error_fraction=2.0"),
    ("train.fused_steps=3", "train.fused_steps=3"),
    ("rl.advantage=nope", "rl.advantage"),
    ("rl.loss=nope", "rl.loss"),
    ("rl.kl_estimator=k9", "rl.kl_estimator"),
    ("rl.loss_aggregation=sum", "rl.loss_aggregation='sum'"),
    ("rl.clip_eps_low=-0.1", "rl.clip_eps_low=-0.1"),
    ("rl.kl_coef=-1.0", "rl.kl_coef=-1.0"),
    ("rl.num_minibatches=3", "rl.num_minibatches=3"),
    ("rl.num_micro_batches=5", "rl.num_micro_batches=5"),
    ("rl.advantage=gae", "rl.value_head='none'"),
    ("task.name=chess", "task.name"),
    ("reward.name=nope", "nope"),
    ("mesh.tensor=0", "mesh.tensor=0"),
    ("distributed.mode=cluster", "distributed.mode='cluster'"),
    ("lora.rank=-1", "lora.rank=-1"),
    ("rollout.max_new_tokens=3", "rollout.max_new_tokens=3 is shorter than the longest answer"),
    ("seed=-1", "seed=-1; use a whole number in [0, 4294967295]"),
    ("seed=4294967296", "seed=4294967296"),
    ("train.steps=2147483648", "train.steps=2147483648 is beyond what JAX's 32-bit integers"),
    ("rollout.group_size=10000000000", "rollout.group_size=10000000000"),
    ("optim.warmup_steps=-1", "optim.warmup_steps=-1"),
    ("data.prompt_bucket=-1", "data.prompt_bucket=-1"),
    ("data.max_prompt_tokens=0", "data.max_prompt_tokens=0"),
    ("rl.ref_update_every=-1", "rl.ref_update_every=-1"),
    ("rl.max_extra_rollouts=-1", "rl.max_extra_rollouts=-1"),
    ("train.num_samples=-1", "train.num_samples=-1"),
    ("train.samples_every=-1", "train.samples_every=-1"),
    ("rl.max_staleness=1000000", "rl.max_staleness=1000000 keeps 1000000 copies"),
]


@pytest.mark.parametrize("override,needle", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_bad_config_field_is_one_sentence(capfd, tmp_path, override, needle):
  _expect(capfd, [f"--config={TINY}", f"--config.{override}"], str(tmp_path / "run"), needle)


def test_no_samples_is_a_valid_setting(capfd, tmp_path):
  """train.num_samples=0 (no sample completions) used to end in an IndexError at the first
  evaluation."""
  code = cli([f"--config={TINY}", f"--workdir={tmp_path / 'run'}", "--config.warmup.steps=1",
              "--config.train.steps=1", "--config.train.eval_size=8",
              "--config.train.eval_batch_size=8", "--config.rollout.num_prompts=2",
              "--config.rollout.group_size=2", "--config.train.num_samples=0"])
  assert code == 0, capfd.readouterr().err[-3000:]
  assert not (tmp_path / "run" / "samples.jsonl").exists()


# ----------------------------------------------------------------------------- command lines

def test_a_missing_config_file_names_the_path_and_the_current_directory(capfd, tmp_path):
  line = _expect(capfd, ["--config=configs/nope.py"], str(tmp_path / "run"),
                 "--config=configs/nope.py", os.getcwd())
  assert "no such file" in line


@pytest.mark.parametrize("body,needle", [
    ("def get_config(:\n", "SyntaxError"),
    ("def get_config():\n  raise RuntimeError('no data folder configured')\n",
     "get_config() raised RuntimeError: no data folder configured"),
    ("x = 1\n", "defines no get_config()"),
], ids=["syntax", "raises", "no_get_config"])
def test_a_broken_config_file_is_named(capfd, tmp_path, body, needle):
  config = tmp_path / "broken.py"
  config.write_text(body)
  _expect(capfd, [f"--config={config}"], str(tmp_path / "run"), str(config), needle)


@pytest.mark.parametrize("argv,needle", [
    (["--config.rl.nope=1"], "rl has no field 'nope'"),
    (["--config.train.steps=many"], "config.train.steps"),
    (["--vmap_seeds=a,b"], "--vmap_seeds=a,b"),
    (["--vmap_seeds=0,-1"], "--vmap_seeds=0,-1: use whole numbers in [0, 4294967295]"),
], ids=["unknown_field", "bad_value", "bad_seeds", "negative_seed"])
def test_a_bad_command_line_is_one_sentence(capfd, tmp_path, argv, needle):
  _expect(capfd, [f"--config={TINY}", *argv], str(tmp_path / "run"), needle)


@pytest.mark.parametrize("where", ["module", "file", "missing_dependency"])
def test_a_config_imports_module_that_fails_to_import_is_one_sentence(capfd, tmp_path,
                                                                     monkeypatch, where):
  body = ("import grpo_jax_no_such_package\n" if where == "missing_dependency" else
          "raise RuntimeError('boom in my module')\n")
  (tmp_path / "my_rewards_x.py").write_text(body)
  monkeypatch.syspath_prepend(str(tmp_path))
  item = str(tmp_path / "my_rewards_x.py") if where == "file" else "my_rewards_x"
  needles = (("'grpo_jax_no_such_package', which is not installed",) if where ==
             "missing_dependency" else ("RuntimeError: boom in my module", "fix that"))
  _expect(capfd, [f"--config={TINY}", f"--config.imports={item}"], str(tmp_path / "run"),
          f"imports: {item}" if where == "file" else f"imports: module {item!r}", *needles)


def test_missing_flags_are_named(capfd, tmp_path):
  _expect(capfd, [f"--config={TINY}"], None, "--workdir is required")
  _expect(capfd, [], str(tmp_path / "run"), "--config is required")


# ----------------------------------------------------------------------------- workdirs

def test_a_file_as_workdir_is_refused(capfd, tmp_path):
  file = tmp_path / "notes.txt"
  file.write_text("mine")
  _expect(capfd, [f"--config={TINY}"], str(file), f"--workdir={file} is a file")
  _expect(capfd, [f"--config={TINY}"], str(file / "run"), f"{file} is a file")
  assert file.read_text() == "mine"


def test_an_unwritable_workdir_is_refused(capfd, tmp_path):
  """/proc refuses new folders even to root; a chmod-0o500 folder refuses other users."""
  _expect(capfd, [f"--config={TINY}", "--config.warmup.steps=1"], "/proc/grpo_jax_run",
          "--workdir=/proc/grpo_jax_run")
  if os.geteuid() != 0:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    _expect(capfd, [f"--config={TINY}"], str(locked / "run"), "not writable")


# ----------------------------------------------------------------------------- GSM8K inputs

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return save_tiny_qwen2(str(tmp_path_factory.mktemp("ckpt") / "qwen2"))


def _copy(source, tmp_path, name):
  target = tmp_path / name
  shutil.copytree(source, target)
  return target


def _gsm8k(capfd, tmp_path, *needles, model=None, data=EXCERPT, extra=()):
  argv = [f"--config={GSM8K}", f"--config.model.path={model}", f"--config.data.path={data}",
          *GSM8K_SMALL, *extra]
  return _expect(capfd, argv, str(tmp_path / "run"), *needles)


def _write_lines(folder, split, lines, raw=None):
  path = folder / f"{split}.jsonl"
  if raw is not None:
    path.write_bytes(raw)
  else:
    path.write_text("".join(line + "\n" for line in lines))
  return path


@pytest.mark.parametrize("case", [
    "no_train", "no_test", "empty_train", "empty_test", "blank_train", "not_json", "no_answer",
    "no_marker", "not_utf8", "array_line"])
def test_a_bad_data_file_names_the_file_and_line(capfd, tmp_path, checkpoint, case):
  data = _copy(EXCERPT, tmp_path, "data")
  good = (data / "train.jsonl").read_text().splitlines()[0]
  if case == "no_train":
    os.remove(data / "train.jsonl")
    needles = ("has no train.jsonl", str(data))
  elif case == "no_test":
    os.remove(data / "test.jsonl")
    needles = ("has no test.jsonl",)
  elif case == "empty_train":
    path = _write_lines(data, "train", [])
    needles = (str(path), "holds no records")
  elif case == "empty_test":
    path = _write_lines(data, "test", [])
    needles = (str(path), "holds no records")
  elif case == "blank_train":
    path = _write_lines(data, "train", ["", "  "])
    needles = (str(path), "holds no records")
  elif case == "not_json":
    path = _write_lines(data, "train", [good, "{not json"])
    needles = (f"{path}:2 is not valid JSON",)
  elif case == "no_answer":
    path = _write_lines(data, "test", [good, json.dumps({"question": "q"})])
    needles = (f"{path}:2 lacks a string 'question' or 'answer'",)
  elif case == "no_marker":
    path = _write_lines(data, "train", [json.dumps({"question": "q", "answer": "18"})])
    needles = (f"{path}:1", "####")
  elif case == "not_utf8":
    path = _write_lines(data, "train", None, raw=(good + "\n").encode() + b"{\"question\": \"\xff\"}\n")
    needles = (f"{path}:2 is not UTF-8",)
  else:
    path = _write_lines(data, "train", [good, "[1, 2]"])
    needles = (f"{path}:2 is not a JSON object; each line must be one object.",)
  _gsm8k(capfd, tmp_path, *needles, model=checkpoint, data=data)


@pytest.mark.parametrize("extra,needle", [
    (["--config.data.source=hub"], "data.source='hub'"),
    (["--config.data.max_prompt_tokens=8"], "data.max_prompt_tokens=8"),
    (["--config.train.eval_size=1000"], "train.eval_size=1000"),
    (["--config.rollout.max_new_tokens=2000"], "max_position_embeddings=1024"),
    (["--config.reward.name=exact"], "reward.name='exact'"),
    (["--config.warmup.steps=10"], "warmup.steps=10"),
], ids=["source", "prompt_too_short", "eval_size", "past_max_positions", "reward", "warmup"])
def test_a_bad_gsm8k_setting_is_one_sentence(capfd, tmp_path, checkpoint, extra, needle):
  _gsm8k(capfd, tmp_path, needle, model=checkpoint, extra=extra)


def test_an_unprepared_tfds_folder_names_data_tfds_dir(capfd, tmp_path, checkpoint):
  pytest.importorskip("tensorflow_datasets")
  empty = tmp_path / "tfds"
  empty.mkdir()
  _gsm8k(capfd, tmp_path, "not prepared", f"data.tfds_dir='{empty}'", f"data_dir='{empty}'",
         model=checkpoint, extra=["--config.data.source=tfds", f"--config.data.tfds_dir={empty}"])
  # Through `python -m`: tfds's absl warning ("... has no dataset_info.json") used to stand
  # before the sentence.
  out = subprocess.run(
      [sys.executable, "-m", "grpo_jax.main", f"--config={GSM8K}", f"--workdir={tmp_path / 'r'}",
       f"--config.model.path={checkpoint}", *GSM8K_SMALL, "--config.data.source=tfds",
       f"--config.data.tfds_dir={empty}"], cwd=ROOT, capture_output=True, text=True,
      timeout=300)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and "not prepared" in lines[0], out.stderr
