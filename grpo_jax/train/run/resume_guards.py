"""What a resume compares beyond the config and the devices (train/run/workdir.py open_records),
from what each start recorded in run_info.json:

  stage   the stage that made the workdir's checkpoints ("rl", "sft", "rm", "dpo"): another
          stage's checkpoints are never resumed, not even with train.allow_config_change (a
          DPO run would "resume" a finished GRPO run's last step, train nothing and export it
          as its own result). Starts that recorded no stage are not checked.
  data    the sha256 of each data file the stage reads ({config field: {path, sha256}}): a
          file rewritten since the last start is refused like a changed config, or with
          train.allow_config_change resumed and recorded as a change.
  seed_axis
          a seeds run's --seed_axis (vmap or map): the seeds' numbers differ by rounding between
          the two, so a change is refused likewise. Starts that recorded none (a plain run, or
          one older than the record) are not checked.
"""

from __future__ import annotations

import json

from grpo_jax.errors import ConfigError
from grpo_jax.fetch_model import sha256_of  # a file's sha256, read in 1 MiB blocks
from grpo_jax.train.run import files


def file_fingerprints(paths: dict) -> dict:
  """{config field: {path, sha256}} of the fields' files that are set ({field: path})."""
  return {name: {"path": path, "sha256": sha256_of(path)} for name, path in paths.items()
          if path}


def _starts(workdir: str) -> list:
  """The start records of workdir/run_info.json; [] when it is missing or damaged (which
  workdir.record_changes reports)."""
  try:
    text = files.read_text(files.path(workdir, "run_info.json"))
    info = json.loads(text) if text is not None else {}
  except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # (too deep for json)
    return []
  starts = info.get("starts") if isinstance(info, dict) else None
  return [s for s in starts if isinstance(s, dict)] if isinstance(starts, list) else []


def recorded(workdir: str, key: str):
  """The newest start's value of `key` among the starts that recorded one, else None."""
  return next((s[key] for s in reversed(_starts(workdir)) if s.get(key) is not None), None)


def check_stage(workdir: str, stage: str | None) -> None:
  """ConfigError when the workdir's checkpoints were made by another stage than `stage`
  (whatever train.allow_config_change says: a run is resumed by the stage that made it)."""
  before = recorded(workdir, "stage")
  if stage is None or before is None or before == stage:
    return
  export = files.path(workdir, "hf_export")
  switch = {"rm": "rm.export", "dpo": "dpo.export"}.get(before, "train.export")
  start = (f"--config.model.path={export}" if files.exists(export) else
           f"export it (rerun it with --config.{switch}=True), then --config.model.path="
           f"{export}")
  raise ConfigError(f"--workdir={workdir} holds checkpoints of the {before} stage "
                    f"(run_info.json), which the {stage} stage cannot resume, not even with "
                    f"train.allow_config_change; pass a new --workdir (to start from that "
                    f"run's policy: {start}).")


def data_changes(workdir: str, data: dict | None, allow: bool) -> dict:
  """{"sha256 of <field>": [recorded, now]} for each data file (`data`: {field: {path,
  sha256}}) whose bytes differ from the newest start's record of the same path; without
  `allow` (train.allow_config_change) the first one is a ConfigError instead."""
  before = recorded(workdir, "data_files") or {}
  changes = {}
  for name, now in (data or {}).items():
    then = before.get(name) if isinstance(before, dict) else None
    if not isinstance(then, dict) or then.get("path") != now["path"]:
      continue  # a new or another file: the config's own change, checked with the config
    if then.get("sha256") == now["sha256"]:
      continue
    if not allow:
      raise ConfigError(f"resuming {workdir}: {name}={now['path']} changed since the run "
                        f"recorded it (sha256 {str(then.get('sha256'))[:12]}... then, "
                        f"{now['sha256'][:12]}... now), so the steps to come would train on "
                        f"other data than the steps done; restore the file, pass a new "
                        f"--workdir, or pass --config.train.allow_config_change=True to go on "
                        f"with the new file (recorded in run_info.json).")
    changes[f"sha256 of {name}"] = [then.get("sha256"), now["sha256"]]
  return changes


def seed_axis_changes(workdir: str, seed_axis: str | None, allow: bool) -> dict:
  """{"seed_axis": [recorded, now]} when a seeds run resumes with another --seed_axis than its
  newest start recorded; without `allow` (train.allow_config_change) a ConfigError instead."""
  before = recorded(workdir, "seed_axis")
  if seed_axis is None or before is None or before == seed_axis:
    return {}
  if not allow:
    raise ConfigError(f"resuming {workdir}: --seed_axis={seed_axis} differs from the "
                      f"--seed_axis={before} its seeds ran with (run_info.json), so the steps "
                      f"to come would differ by rounding from a run that went on; run with "
                      f"--seed_axis={before}, pass another --workdir, or pass "
                      f"--config.train.allow_config_change=True to resume anyway (recorded in "
                      f"run_info.json).")
  return {"seed_axis": [before, seed_axis]}


def _record_steps(text: str) -> list:
  steps = []
  for line in text.splitlines():
    try:
      steps.append(int(json.loads(line)["step"]))
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError):
      continue  # a blank line or a record cut short: metrics.keep_records_until drops it
  return steps


def _saved_steps(folder) -> list:
  """The step folders' steps in a checkpoint folder, oldest first ([] when it is missing)."""
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) \
      if folder.is_dir() else []


def check_records_reach_checkpoint(workdir: str, checkpoints: str | None = None) -> None:
  """ConfigError when metrics.jsonl stops short of the newest checkpoint (in `checkpoints`,
  default workdir/checkpoints; stacked seeds keep theirs beside their seed_<s> folders): the
  loop writes a step's record before it saves the step (train/run/runner.py), so a file whose
  last intact record is older lost its tail (a full disk, a copy cut short, an edit), and a
  resume from the checkpoint would leave those steps out of the curves with no trace. Refused
  before anything is written, naming the two steps and the fixes (nothing is moved or deleted
  for the user)."""
  folder = files.path(checkpoints) if checkpoints else files.path(workdir, "checkpoints")
  saved = _saved_steps(folder)
  if not saved:
    return
  records = files.read_text(files.path(workdir, "metrics.jsonl"), errors="replace")
  last = max(_record_steps(records or ""),
             default=-1)
  if last >= saved[-1]:
    return
  later = [s for s in saved if s > last]
  earlier = [s for s in saved if s <= last]
  aside = " ".join(str(folder / str(s)) for s in later)
  rewind = (f"resume from checkpoint {earlier[-1]} by moving the newer ones out of "
            f"{folder} (mv {aside} <elsewhere>/)" if earlier else
            "start a new --workdir (no checkpoint is at or before it)")
  raise ConfigError(f"resuming {workdir}: metrics.jsonl ends at step {last} (its last intact "
                    f"record), but the newest checkpoint is step {saved[-1]}, so the records "
                    f"of steps {last + 1}-{saved[-1]} are lost and the curves would have a "
                    f"silent gap; put the lost records back (from a copy of the file), or "
                    f"{rewind}.")
