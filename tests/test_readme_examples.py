"""Every command and link of README.md and docs/*.md, checked without training, and the
8-device example of docs/meshes.md run as written (fewer steps) on fake CPU devices.

Each ```bash block is split into commands. For `python -m grpo_jax.<module>`: the module exists,
its flags exist, and a `--config=FILE[:ARG]` with `--config.x=y` overrides is loaded and
overridden by ml_collections' config_flags (as grpo_jax.main does) and passed through
grpo_jax.config.validate, the check every stage runs before any compute. Scripts
(`python benchmarks/...`, `bash launch/...`), their flags, sweep files, pip extras and test
files must exist. The checks run in one child process, so that `config.imports` plugins the
docs define (`# my_rl.py` blocks, written to a scratch folder that is the commands' working
directory) register nowhere else.

A command whose config names an input that a clean clone lacks (a downloaded checkpoint, the
user's data, a folder an earlier command writes) is parsed and overridden but not validated;
ABSENT_INPUTS lists each such input with the reason. A value written `...` (`--sweep=...`) is
elided, not checked.
"""

import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Inputs a clean clone lacks (a substring of the path), and why.
ABSENT_INPUTS = {
    "smollm2-135m-instruct": "the SmolLM2 checkpoint `python -m grpo_jax.fetch_model` writes",
    "/ckpt/": "a checkpoint downloaded with `hf download`",
    "/tmp/elsewhere/": "the folder `python -m grpo_jax.fetch_model --out` wrote",
    "/data/gsm8k": "GSM8K, written by `python -m grpo_jax.data.fetch_gsm8k`",
    "hf_export": "the export of the command before it",
    "/tmp/distill_tiny/teacher": "the teacher the command before it trains",
    "/tmp/kto_unpaired": "the files `python launch/kto_unpaired_data.py` writes",
    "ROOT/": "the folders of the pipeline's earlier stages",
    "my_data.jsonl": "the user's own data (tests/test_table.py runs that command end to end)",
    "BytedTsinghua-SIA/DAPO-Math-17k": "DAPO's math data on the Hub (configs/grpo_long_cot.py; "
                                       "its run needs a 7B checkpoint and 8 GPUs or a v5p slice)",
}
# Commands that are not this repository's (their lines are not checked).
EXTERNAL_COMMANDS = {"cd", "hf", "huggingface-cli", "tensorboard", "wandb", "curl", "gcloud",
                     "gsutil", "ssh", "sbatch", "srun", "docker", "kill", "ls", "cat",
                     "mkdir", "echo", "openssl", "head", "tail", "nvidia-smi", "git", "nohup",
                     "chmod", "cp", "mv", "rm", "tar", "unzip", "wget", "sleep", "source"}
ABSL_FLAGS = {"verbosity", "v", "logtostderr", "alsologtostderr", "helpfull", "help"}
# Config fields that name an input file or folder.
PATH_FIELDS = ("model.path", "rl.distill_teacher", "warmup.data_path", "dpo.train_path",
               "dpo.test_path", "rm.train_path", "rm.test_path", "tfgrpo.summariser_path")


def doc_files() -> list:
  return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def bash_blocks(text: str) -> list:
  return re.findall(r"```bash\n(.*?)```", text, re.S)


def commands_of(block: str) -> list:
  """The block's simple commands as shell words: continuations joined, comments dropped, split
  at `&&` and `;`."""
  commands = []
  for line in block.replace("\\\n", " ").splitlines():
    words, current = shlex.split(line, comments=True), []
    for word in words:
      if word in ("&&", ";", "||"):
        commands.append(current)
        current = []
      else:
        current.append(word)
    commands.append(current)
  return [c for c in commands if c]


def named_python_blocks(texts: list) -> dict:
  """{file name: code} of the ```python blocks whose first line is `# name.py`."""
  named = {}
  for text in texts:
    for name, code in re.findall(r"```python\n# (\w+\.py)\n(.*?)```", text, re.S):
      named[name] = code
  return named


def _source(path: str) -> str:
  with open(path) as f:
    return f.read()


def _flag_known(name: str, sources: list) -> bool:
  pattern = re.compile(r"""["'](--)?%s["']""" % re.escape(name))
  return name in ABSL_FLAGS or any(pattern.search(s) for s in sources)


def _unknown_flags(args: list, sources: list) -> list:
  names = [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]
  return [n for n in names if not n.startswith("config") and not _flag_known(n, sources)]


def _get(config, dotted: str):
  value = config
  for part in dotted.split("."):
    if part not in value:
      return None
    value = value[part]
  return value


def absent_inputs(config) -> list:
  """The input paths the config names that do not exist here."""
  paths = [_get(config, f) for f in PATH_FIELDS]
  paths += [m.get("path") for m in (_get(config, "reward.models") or [])]
  if _get(config, "task.name") == "table":
    paths.append(_get(config, "data.source"))
  if _get(config, "task.name") == "gsm8k" and _get(config, "data.source") == "jsonl":
    paths.append(_get(config, "data.path"))
  paths = [p for p in paths if isinstance(p, str) and p and not p.startswith("http")]
  return [p for p in paths if not os.path.exists(p)]


def load_config(config_args: list):
  """The config as `python -m grpo_jax.main` builds it: config_flags reads the overrides from
  sys.argv when it defines its flags, then parses them."""
  from absl import flags  # noqa: PLC0415
  from ml_collections import config_flags  # noqa: PLC0415
  values = flags.FlagValues()
  saved, sys.argv = sys.argv, ["prog", *config_args]
  try:
    config_flags.DEFINE_config_file("config", None, "the config", flag_values=values)
    values(["prog", *config_args])
    return values.config
  finally:
    sys.argv = saved


def check_grpo_module(module: str, args: list) -> tuple:
  """(problem or None, reason validation was skipped or None) for `python -m <module> args`."""
  import importlib.util  # noqa: PLC0415
  spec = importlib.util.find_spec(module)
  if spec is None or spec.origin is None:
    return f"no module {module}", None
  sources = [_source(spec.origin)]
  if "from grpo_jax.main import" in sources[0]:
    sources.append(_source(os.path.join(ROOT, "grpo_jax", "main.py")))
  unknown = _unknown_flags(args, sources)
  if unknown:
    return f"{module} has no flag(s) {unknown}", None
  config_args = [a.replace("$REPO", ROOT) for a in args if a.startswith("--config")]
  if not config_args:
    return None, None
  path = config_args[0].split("=", 1)[1]
  if not os.path.isabs(path):
    config_args[0] = "--config=" + os.path.join(ROOT, path)
  from grpo_jax import config as config_lib  # noqa: PLC0415
  try:
    config = load_config(config_args)
    missing = absent_inputs(config)
    unexplained = [p for p in missing if not any(k in p for k in ABSENT_INPUTS)]
    if unexplained:
      return f"names {unexplained}, absent from a clean clone and not in ABSENT_INPUTS", None
    if missing:
      reasons = [next(r for k, r in ABSENT_INPUTS.items() if k in p) for p in missing]
      return None, "; ".join(dict.fromkeys(reasons))
    config_lib.validate(config)
  except BaseException as e:  # noqa: BLE001  any failure is the doc's problem, named
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", None
  return None, None


def check_python_c(code: str) -> str | None:
  import contextlib  # noqa: PLC0415
  import io  # noqa: PLC0415
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      exec(compile(code, "<python -c>", "exec"), {})  # noqa: S102  the docs' own one-liner
  except BaseException as e:  # noqa: BLE001
    return f"{type(e).__name__}: {e}"
  return None


def check_script(path: str, args: list) -> str | None:
  full = os.path.join(ROOT, path)
  if not os.path.isfile(full):
    return f"no file {path}"
  unknown = _unknown_flags(args, [_source(full)]) if path.endswith(".py") else []
  if unknown:
    return f"{path} has no flag(s) {unknown}"
  sweeps = [a.split("=", 1)[1] for a in args if a.startswith("--sweep=")]
  if sweeps and sweeps[0] != "...":  # `--sweep=...` elides the file
    from grpo_jax.sweep.spec import load_sweep  # noqa: PLC0415
    try:
      load_sweep(os.path.join(ROOT, sweeps[0]))
    except Exception as e:  # noqa: BLE001
      return f"{type(e).__name__}: {e}"
  return None


def check_pip(args: list) -> str | None:
  import tomllib  # noqa: PLC0415
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    extras = set(tomllib.load(f)["project"]["optional-dependencies"])
  for arg in args:
    match = re.fullmatch(r"\.\[([\w,]+)\]", arg)
    if match and not set(match.group(1).split(",")) <= extras:
      return f"pyproject.toml has no extra {match.group(1)} (extras: {sorted(extras)})"
  return None


def check_command(words: list) -> tuple:
  """(problem or None, skip reason or None) for one command of a doc. `VAR=value` prefixes and
  `export VAR=value` set the variable for the checks (here and for the rest of the process)."""
  while words and re.fullmatch(r"[A-Za-z_]+=.*", words[0]):
    name, value = words[0].split("=", 1)
    os.environ.setdefault(name, value)
    words = words[1:]
  program, args = words[0], words[1:]
  if program == "export":
    for name, value in (a.split("=", 1) for a in args if "=" in a):
      os.environ.setdefault(name, value)
    return None, None
  if program in EXTERNAL_COMMANDS:
    return None, None
  if program == "python" and args[:2] == ["-m", "pip"]:
    return check_pip(args[2:]), None
  if program == "python" and args[:1] == ["-m"]:
    if not args[1].startswith("grpo_jax"):
      return f"python -m {args[1]} is not this repository's", None
    return check_grpo_module(args[1], args[2:])
  if program == "python" and args[:1] == ["-c"]:
    return check_python_c(args[1]), None
  if program in ("python", "bash"):
    return check_script(args[0], args[1:]), None
  if program == "pip":
    return check_pip(args), None
  if program == "pytest":
    missing = [a for a in args if a.startswith("tests/") and not os.path.exists(
        os.path.join(ROOT, a.split("::")[0]))]
    return (f"no test file(s) {missing}" if missing else None), None
  return f"unknown command {program!r} (add it to EXTERNAL_COMMANDS if it is not ours)", None


def check_all_docs(scratch: str) -> list:
  """One record per command of every doc: {doc, command, problem, skipped}. The commands run in
  `scratch`, which holds the docs' named Python files (the `PYTHONPATH=.` of their examples)."""
  texts = {path: _source(path) for path in doc_files()}
  for name, code in named_python_blocks(list(texts.values())).items():
    with open(os.path.join(scratch, name), "w") as f:
      f.write(code)
  os.chdir(scratch)
  sys.path[:0] = [scratch, ROOT]
  records = []
  for path, text in texts.items():
    for block in bash_blocks(text):
      for words in commands_of(block):
        problem, skipped = check_command(words)
        records.append(dict(doc=os.path.relpath(path, ROOT), command=" ".join(words),
                            problem=problem, skipped=skipped))
  return records


# Commands each check must refuse: an unknown field, an unknown estimator, a missing module, an
# unknown flag, an unknown pip extra; and one it must accept.
CONTROLS = [
    ["python", "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
     "--config.rl.no_such_field=1"],
    ["python", "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
     "--config.rl.advantage=no_such_estimator"],
    ["python", "-m", "grpo_jax.no_such_module"],
    ["python", "-m", "grpo_jax.main", "--no_such_flag=1"],
    ["pip", "install", "-e", ".[no_such_extra]"],
    ["python", "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py", "--config.rl.kl_coef=0.0"],
]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
  """The child process's records of every doc command, and the controls' problems."""
  scratch = tmp_path_factory.mktemp("docs_scratch")
  out = subprocess.run([sys.executable, os.path.abspath(__file__), str(scratch)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_command_in_the_docs_is_checked(checked):
  records = checked["records"]
  for r in records:
    if r["skipped"]:
      print(f"not validated ({r['skipped']}): {r['doc']}: {r['command']}")
  problems = [f"{r['doc']}: {r['command']}\n  -> {r['problem']}" for r in records if r["problem"]]
  assert not problems, "\n".join(problems)
  main_commands = [r for r in records if "python -m grpo_jax.main" in r["command"]]
  assert len(main_commands) >= 20 and len({r["doc"] for r in records}) >= 10


def test_the_checks_refuse_a_bad_override_module_flag_or_extra(checked):
  *bad, good = checked["controls"]
  assert all(bad) and good is None, checked["controls"]
  assert "no_such_estimator" in bad[1] and "no_such_flag" in bad[3], bad


# Link targets that other work adds (checked once they exist); none now.
PENDING_TARGETS: dict = {}


def heading_anchor(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def _prose(text: str) -> str:
  return re.sub(r"```.*?```", "", text, flags=re.S)


def test_every_link_in_the_docs_resolves():
  """Relative links of README.md and docs/*.md name files that exist, and their #anchors
  headings of those files."""
  problems = []
  for doc in doc_files():
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(_source(doc))):
      if target.startswith(("http://", "https://", "mailto:")):
        continue
      path, _, anchor = target.partition("#")
      full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
      if not os.path.exists(full):
        if os.path.relpath(full, ROOT) not in PENDING_TARGETS:
          problems.append(f"{os.path.relpath(doc, ROOT)}: {target} (no such file)")
        continue
      if anchor and full.endswith(".md"):
        headings = re.findall(r"^#+ (.*)$", _prose(_source(full)), re.M)
        if anchor not in {heading_anchor(h) for h in headings}:
          problems.append(f"{os.path.relpath(doc, ROOT)}: {target} (no such heading)")
  assert not problems, "\n".join(problems)


def test_the_8_device_example_runs_as_written(tmp_path):
  text = _source(os.path.join(ROOT, "docs", "meshes.md"))
  block = re.search(r"# 8 local devices, FSDP x tensor parallel.*?\n(XLA_FLAGS=.*?)\n```", text,
                    re.S).group(1)
  words = shlex.split(block.replace("\\\n", " "))
  readme_flags = [w.split("=", 1)[1] for w in words if w.startswith("XLA_FLAGS=")]
  env = dict(os.environ, XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""), *readme_flags]))
  argv = [w for w in words if not w.startswith("XLA_FLAGS=")]
  assert argv[:3] == ["python", "-m", "grpo_jax.main"]
  workdir = tmp_path / "tiny8"
  argv = [sys.executable, *argv[1:]]
  argv = [f"--workdir={workdir}" if a.startswith("--workdir=") else a for a in argv]
  out = subprocess.run([*argv, "--config.warmup.steps=20", "--config.train.steps=2",
                        "--config.train.eval_every=2"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert ("mesh (data, fsdp, tensor, expert, context) = (2, 2, 2, 1, 1) over 8 devices"
          in out.stdout)
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1, 2] and "eval_accuracy" in records[-1]


if __name__ == "__main__":  # the child process of the `checked` fixture
  records = check_all_docs(sys.argv[1])
  os.chdir(ROOT)
  print(json.dumps(dict(records=records, controls=[check_command(c)[0] for c in CONTROLS])))
