"""Every arm's config checked before any job starts: a field the config does not have, a value
its flag parser rejects, or one the stage's validation refuses would otherwise start every job
to fail alike, its reason only in each job's sweep_job.log.

An arm's config is built as its process builds it: the job's --config file and --config.*
flags parsed by ml_collections' own flag parser, in the folder the jobs run from; then a Hub id
in model.path is resolved (grpo_jax/models/hub.py) and the config validated
(grpo_jax/config.py `validate`, which imports config.imports; for grpo_jax.main the RL stage's
check_rl_config, which adds its experience source's and vision policy's checks; the
Training-Free GRPO stage's own checks for its program). The first problem is one SweepError
naming the arm and the field.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import sys

from grpo_jax.errors import ConfigError, first_line
from grpo_jax.sweep.spec import Job, Sweep, SweepError, jobs


# The checks a program runs on its config first, as "module:function" (default: validate).
CONFIG_CHECKS = {
    "grpo_jax.main": "grpo_jax.train.stages.rl_checks:check_rl_config",
    "grpo_jax.train_training_free": "grpo_jax.training_free.checks:check_training_free_config",
}
DEFAULT_CHECK = "grpo_jax.config:validate"


def _config_check(program: str):
  module, name = CONFIG_CHECKS.get(program, DEFAULT_CHECK).split(":")
  return getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def _in_folder(folder: str, argv: list | None = None):
  """The jobs' working folder, for relative paths (contextlib.chdir is Python 3.11+), and with
  `argv` their sys.argv, from which config_flags reads a config file's overrides as it parses."""
  saved_cwd, saved_argv = os.getcwd(), sys.argv
  os.chdir(folder)
  sys.argv = saved_argv if argv is None else argv
  try:
    yield
  finally:
    os.chdir(saved_cwd)
    sys.argv = saved_argv


def parse_config(argv: list, cwd: str):
  """The config of `--config=FILE [--config.a.b=v ...]` as a process started in `cwd` parses
  it (absl flags with ml_collections' config_flags, as grpo_jax.main)."""
  from absl import flags  # noqa: PLC0415
  from ml_collections import config_flags  # noqa: PLC0415
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "the arm's config", flag_values=values,
                                  lock_config=True)
  with _in_folder(cwd, ["sweep", *argv]):
    values(["sweep", *argv])
    return values["config"].value


def _unknown_field(config, dotted: str) -> str | None:
  """Why `dotted` is not a field of `config` (with the nearest name), or None when it is."""
  node, walked = config, []
  for part in dotted.split("."):
    if not hasattr(node, "keys") or part not in node:
      where = ".".join(walked) or "the top level"
      names = list(node.keys()) if hasattr(node, "keys") else []
      near = difflib.get_close_matches(part, names, n=1)
      hint = f"; did you mean {'.'.join(walked + near)}?" if near else ""
      return f"{dotted} is not a config field ({where} has no field {part!r}{hint})"
    node, walked = node[part], walked + [part]
  return None


def check_job(job: Job, config_file: str, cwd: str) -> None:
  """SweepError naming the job's arm and the first thing its process would refuse."""
  arm = job.arm
  try:
    found = importlib.util.find_spec(arm.program) is not None
  except (ImportError, ValueError):
    found = False
  if not found:  # checked before any job runs
    raise SweepError(f"arm {arm.name!r}: its program {arm.program!r} is not a module Python "
                     f"can run (python -m {arm.program}); fix the recipe's program, e.g. "
                     f"'grpo_jax.main' or 'grpo_jax.train_dpo'.")
  if not os.path.isfile(os.path.join(cwd, config_file.split(":", 1)[0])):  # (file.py:argument)
    raise SweepError(f"arm {arm.name!r}: its config {config_file} is not a file (looked in "
                     f"{cwd}); fix the sweep's base_config or recipes.")
  try:
    base = parse_config([f"--config={config_file}"], cwd)
  except (Exception, SystemExit) as e:  # noqa: BLE001  a user's config file may raise anything
    raise SweepError(f"arm {arm.name!r}: its config {config_file} could not be loaded "
                     f"({first_line(e)}); fix that file.") from None
  for key in arm.overrides:
    why = _unknown_field(base, key)
    if why:
      where = "its grid value" if key in arm.values else "overrides or arm_overrides"
      raise SweepError(f"arm {arm.name!r}: {why}; fix {where} in the sweep file.")
  argv = [part for part in job.command if part.startswith("--config")]
  try:
    config = parse_config(argv, cwd)
  except (Exception, SystemExit) as e:  # noqa: BLE001  absl raises several types here
    raise SweepError(f"arm {arm.name!r}: its flags do not parse ({first_line(e)}); fix that "
                     f"value in the sweep file.") from None
  from grpo_jax.models.hub import resolve_config_model_path  # noqa: PLC0415
  try:
    with _in_folder(cwd):
      resolve_config_model_path(config)
      _config_check(arm.program)(config)
  except ConfigError as e:
    raise SweepError(f"arm {arm.name!r}: {' '.join(str(e).splitlines())}") from None


def check_arms(sweep: Sweep, sweep_dir: str, cwd: str, pending: list[Job] | None = None) -> None:
  """Checks one job of each arm (of `pending`, else of every arm) before any job starts."""
  if pending is None:
    pending = jobs(sweep, sweep_dir, {arm.name: sweep.seeds for arm in sweep.arms})
  checked = set()
  for job in pending:
    if job.arm.name not in checked:
      checked.add(job.arm.name)
      check_job(job, job.arm.config or sweep.base_config, cwd)
