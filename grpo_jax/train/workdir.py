"""What a run records about itself in its workdir: the resolved config (config.json) and, for
each start or resume, the package versions and the git commit of the code (run_info.json)."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy")


def package_versions() -> dict:
  """Installed versions of the packages a run's numbers depend on (None if not installed)."""
  versions = {"python": platform.python_version()}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  return versions


def _git(directory: str, *args: str) -> str | None:
  try:
    out = subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True,
                         timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def code_version(directory: str | None = None) -> dict:
  """The git commit of the code that runs (grpo_jax's own checkout) and whether its tree has
  uncommitted changes; both None when the package is not in a git checkout."""
  directory = directory or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  commit = _git(directory, "rev-parse", "HEAD")
  status = _git(directory, "status", "--porcelain") if commit else None
  return {"git_commit": commit, "git_dirty": None if status is None else bool(status),
          "code_dir": directory}


def write_config(config, workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))


def record_start(workdir: str, resumed_from_step: int | None) -> dict:
  """Appends this start (time, resumed step, versions, code) to workdir/run_info.json, whose
  "starts" list then tells which code produced which part of the run."""
  path = os.path.join(workdir, "run_info.json")
  info = {"starts": []}
  if os.path.exists(path):
    try:
      with open(path) as f:
        info = json.load(f)
    except ValueError:
      info = {"starts": []}
  entry = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "resumed_from_step": resumed_from_step, "versions": package_versions(),
           **code_version()}
  info["starts"] = [*info.get("starts", []), entry]
  with open(path + ".tmp", "w") as f:
    json.dump(info, f, indent=2)
  os.replace(path + ".tmp", path)
  return entry
