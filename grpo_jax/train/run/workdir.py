"""What a run records about itself in its workdir: the resolved config (config.json) and, for
each start or resume, the package versions and the git commit of the code (run_info.json)."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess

from flax.traverse_util import flatten_dict

from grpo_jax.errors import ConfigError, InputError, first_line, json_limit
from grpo_jax.train.run import files
from grpo_jax.train.run.faults import RunStopped
from grpo_jax.train.run.metrics import keep_records_until

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


def check_workdir(workdir: str, checkpoints: bool = True) -> None:
  """Raises InputError, before anything is written, when `workdir` cannot hold a run: it is a
  file, an ancestor is a file, the folder (or the nearest existing ancestor that would hold
  it) is not writable, or (with `checkpoints`) its checkpoint folders cannot be used."""
  if not workdir:
    raise InputError("--workdir is empty; pass the folder for the run's outputs, e.g. "
                     "--workdir=/tmp/grpo_tiny.")
  if files.is_uri(workdir):  # an object store: its first write says whether it can be written
    return
  path = os.path.abspath(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise InputError(f"--workdir={workdir} is a file, not a folder; pass a folder (new or one "
                     f"of an earlier run), e.g. --workdir={workdir}_run.")
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise InputError(f"--workdir={workdir} cannot be created: {existing} is a file; pass a "
                     f"path whose parents are folders.")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise InputError(f"--workdir={workdir} is not writable ({existing} denies writing to this "
                     f"user); pass a folder you can write to.")
  if checkpoints and os.path.isdir(path):  # (grpo_jax.eval saves none)
    for name in sorted(os.listdir(path)) if os.access(path, os.R_OK) else ():
      if name.startswith("checkpoints") and os.path.isdir(os.path.join(path, name)):
        check_checkpoints_access(os.path.join(path, name))


RUN_FILES = ("run_info.json", "metrics.jsonl", "checkpoints")


def check_not_a_run(workdir: str) -> None:
  """Raises InputError when `workdir` holds a training run's files: an evaluation alone must
  not overwrite the run's samples.jsonl or sit beside its records."""
  path = os.path.abspath(workdir)
  found = [n for n in RUN_FILES if os.path.exists(os.path.join(path, n))]
  if not files.is_uri(workdir) and found:
    raise InputError(f"--workdir={workdir} holds a training run ({', '.join(found)}); give "
                     f"the evaluation its own folder, e.g. --workdir={os.path.join(workdir, 'eval')}"
                     f", so that the run's samples.jsonl is kept.")


def check_checkpoints_access(folder: str) -> None:
  """Raises InputError, before any compute, when this user cannot write `folder` (a run's
  checkpoints) or read everything in it: found otherwise only at the first save, after the
  work, or taken for a damaged checkpoint at the restore."""
  def refuse(path: str, what: str):
    raise InputError(f"{path} is not {what} by this user, so the run could not "
                     f"{'save' if what == 'writable' else 'resume from'} its checkpoints; fix "
                     f"the permissions (e.g. chmod -R u+rwX {folder}) or pass another "
                     f"--workdir.")
  if not os.access(folder, os.R_OK | os.X_OK):
    refuse(folder, "readable")
  if not os.access(folder, os.W_OK):
    refuse(folder, "writable")
  for root, dirs, names in os.walk(folder):
    for name, mode in [(d, os.R_OK | os.X_OK) for d in dirs] + [(n, os.R_OK) for n in names]:
      if not os.access(os.path.join(root, name), mode):
        refuse(os.path.join(root, name), "readable")


class WorkdirBusy(RunStopped):
  """Another live process holds the workdir's lock."""


class WorkdirLock:
  """An exclusive lock on workdir/.lock for the whole run: a second run on the same workdir
  stops at once, naming the holder's PID. It is a flock, which the kernel releases when the
  holding process ends in any way (kill -9 included), so no stale lock is ever left behind;
  the file's content is only the holder's PID, for the message.

  On an object store (a gs:// workdir) no such lock can be made safe: there is no flock, and a
  lock object left by a preempted VM could not be told from a live one, which would block the
  automatic resume preemptible VMs rely on. There the lock is advisory: .lock names the last
  run to start (host and PID) and nothing stops a second run, so give each run its own
  workdir."""

  def __init__(self, workdir: str):
    self.workdir, self.path, self.fd = workdir, os.path.join(workdir, ".lock"), None

  def __enter__(self) -> "WorkdirLock":
    if files.is_uri(self.workdir):
      try:
        files.makedirs(self.workdir)
        files.write_atomic(files.path(self.workdir, ".lock"),
                           f"{platform.node()} {os.getpid()}")
      except Exception as e:  # noqa: BLE001  fsspec back-ends raise their own types
        raise InputError(f"--workdir={self.workdir} cannot be written ({type(e).__name__}: "
                         f"{first_line(e)}); check the URI and its credentials (gs:// needs "
                         f"gcsfs).") from None
      return self
    import fcntl  # noqa: PLC0415  (POSIX; the project runs on Linux)
    try:
      os.makedirs(self.workdir, exist_ok=True)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # read-only file system, permissions, a file in the way
      raise InputError(f"--workdir={self.workdir} cannot be written ({first_line(e)}); pass a "
                       f"folder you can write to.") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      raise WorkdirBusy(f"the workdir {self.workdir} is in use by another run (PID {holder}); "
                        f"wait for it to end, stop it, or pass another --workdir.") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    self.fd = fd
    return self

  def __exit__(self, *exc) -> None:
    import fcntl  # noqa: PLC0415
    if self.fd is not None:
      fcntl.flock(self.fd, fcntl.LOCK_UN)
      os.close(self.fd)
      self.fd = None


def write_config(config, workdir: str) -> None:
  files.makedirs(workdir)
  files.write_atomic(files.path(workdir, "config.json"),
                     config.to_json_best_effort(indent=2, sort_keys=True))


# Fields a resumed run may change without train.allow_config_change: how long it runs (the
# stage's `length` only under optim.schedule 'constant': check_resume_config) and what it keeps
# or prints, never what it computes, and the multi-host start-up (a restarted job may get
# another coordinator).
FREE_TO_CHANGE = ("train.steps", "train.eval_every", "train.checkpoint_every",
                  "train.keep_checkpoints", "train.export", "train.allow_config_change",
                  "train.wandb_", "train.compilation_cache", "distributed.",
                  # a teacher server's deadline and retries: what a RemoteOutage says to raise
                  "rl.distill_teacher_timeout_s", "rl.distill_teacher_max_retries",
                  "rl.distill_teacher_backoff_s",
                  # a reward function's time limit: what a RewardTimeout says to raise
                  "reward.timeout_s")


class RecordDamaged(InputError):
  """A workdir with checkpoints whose config.json or run_info.json is missing or damaged."""


def _read_json(workdir: str, name: str):
  """(the parsed JSON object, None) or (None, what is wrong with the file)."""
  try:
    text = files.read_text(files.path(workdir, name))
    value = None if text is None else json.loads(text)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:  # unreadable, not UTF-8/JSON
    return None, f"damaged ({first_line(e, 120)})"
  except (ValueError, RecursionError) as e:  # valid JSON that Python's json cannot read
    return None, f"damaged (it {json_limit(e, fix=False)})"
  if text is None:
    return None, "missing"
  if not isinstance(value, dict):
    return None, f"damaged (it holds a JSON {type(value).__name__}, not an object)"
  return value, None


def _damaged_record(workdir: str, name: str, problem: str, allow: bool, consequence: str,
                    allowed: str, after: str) -> dict:
  """RecordDamaged for workdir/name, or with `allow` the change {name: [problem, after]}."""
  if not allow:
    raise RecordDamaged(f"{workdir}/{name} is {problem}{consequence}; restore the file, pass "
                        f"another --workdir, or pass --config.train.allow_config_change=True "
                        f"to {allowed}.")
  return {name: [problem.split(" (")[0], after]}


def config_changes(config, workdir: str, allow: bool = False) -> dict:
  """{field: [recorded value, new value]} for every field of `config` that differs from
  workdir/config.json (a field only one side has counts, with None on the other, except a
  field the record lacks that holds its default: one added to grpo_jax since the record was
  written). Called for a workdir with checkpoints: a missing or damaged config.json raises
  RecordDamaged, or with `allow` (train.allow_config_change) counts as the change
  {"config.json": [what was wrong, "rewritten"]}."""
  old, problem = _read_json(workdir, "config.json")
  if problem:
    return _damaged_record(workdir, "config.json", problem, allow,
                           ", so the config its checkpoints were made with cannot be checked",
                           "resume under this config (recorded in run_info.json)", "rewritten")
  old = flatten_dict(old, sep=".")
  new = flatten_dict(json.loads(config.to_json_best_effort(sort_keys=True)), sep=".")
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  default = flatten_dict(json.loads(get_defaults().to_json_best_effort(sort_keys=True)), sep=".")
  return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new))
          if old.get(k) != new.get(k)
          and not (k not in old and k in default and new[k] == default[k])}


def record_changes(workdir: str, devices: dict, allow: bool = False,
                   missing_ok: bool = False) -> dict:
  """What the start record of a workdir with checkpoints says changed: {"devices": [recorded,
  now]} when the last start ran on other devices (another count, mesh or kind: the losses would
  differ by rounding). A missing or damaged run_info.json raises RecordDamaged, or with `allow`
  counts as the change {"run_info.json": [what was wrong, "new record"]}; `missing_ok`: a
  missing one is no record yet."""
  info, problem = _read_json(workdir, "run_info.json")
  if problem == "missing" and missing_ok:
    return {}
  if problem is None and not isinstance(info.get("starts"), list):
    problem = "damaged (it has no list of starts)"
  if problem:
    return _damaged_record(workdir, "run_info.json", problem, allow,
                           ": it records every start of the run", "resume and start a new "
                           "record (a damaged one is kept as run_info.json.damaged)",
                           "new record")
  recorded = next((s["devices"] for s in reversed(info["starts"])
                   if isinstance(s, dict) and isinstance(s.get("devices"), dict)), None)
  if recorded and all(isinstance(d.get("mesh"), list) for d in (recorded, devices)):
    # A recorded mesh with fewer sizes than today's lacks the newest axes, which were 1.
    missing = len(devices["mesh"]) - len(recorded["mesh"])
    recorded = {**recorded, "mesh": recorded["mesh"] + [1] * max(missing, 0)}
  return {"devices": [recorded, devices]} if recorded and recorded != devices else {}


# Fields whose change alters the checkpointed state's structure: no resume can restore it.
NEVER_CHANGED = {"rl.max_staleness": "one copy of the parameters per update a batch may lag"}


def check_resume_config(changes: dict, workdir: str, allow: bool, log=print,
                        free: tuple = (), length: tuple = ("train.steps",),
                        schedule: str = "constant") -> None:
  """Refuses to resume `workdir` under a config (or on devices) whose changes go beyond
  FREE_TO_CHANGE and the stage's own `free` fields, and its `length` fields unless `schedule`
  (optim.schedule) is 'constant', unless `allow` (train.allow_config_change), which then lists
  them in one line; before anything of the workdir is rewritten."""
  for key in NEVER_CHANGED:
    if key in changes:  # one sentence naming the key, not orbax's dump
      a, b = changes[key]
      raise ConfigError(f"resuming {workdir}: {key} {json.dumps(a)} -> {json.dumps(b)} changes "
                        f"what its checkpoints hold ({NEVER_CHANGED[key]}), so they cannot be "
                        f"restored, not even with train.allow_config_change; run with "
                        f"{key}={json.dumps(a)}, or pass another --workdir.")
  fixed = () if schedule == "constant" else length  # a decaying rate is spread over the length
  refused = {k: v for k, v in changes.items()
             if k in fixed or not k.startswith(FREE_TO_CHANGE + free + length)}
  listed = ", ".join(f"{k} ({_devices(a)}) -> ({_devices(b)})" if k == "devices" else
                     f"{k} {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in
                     list(refused.items())[:8])
  more = f" and {len(refused) - 8} more" if len(refused) > 8 else ""
  if refused and allow:
    log(f"resuming {workdir} with changes allowed by train.allow_config_change: {listed}{more} "
        f"(recorded in run_info.json)")
  elif set(refused) == {"devices"}:
    old, new = refused["devices"]
    raise ConfigError(f"resuming {workdir} on other devices than its last start ({_devices(new)} "
                      f"now, {_devices(old)} then), so its losses would differ by rounding; run "
                      f"on the same devices, pass another --workdir, or pass "
                      f"--config.train.allow_config_change=True to resume anyway (recorded in "
                      f"run_info.json).")
  elif refused:
    why = (f", and optim.schedule={schedule!r} spreads the learning rate's decay over the run's "
           f"length, so the run would differ from one that ran through" if set(fixed) & set(refused)
           else "")
    raise ConfigError(f"resuming {workdir} under a config that differs from its config.json "
                      f"({listed}{more}){why}; run with its recorded config, pass another "
                      f"--workdir, or pass --config.train.allow_config_change=True to resume "
                      f"anyway (the changes are recorded in run_info.json).")


def _devices(d: dict) -> str:
  if not isinstance(d, dict):
    return str(d)
  mesh = f", mesh {tuple(d['mesh'])}" if isinstance(d.get("mesh"), list) else ""
  return f"{d.get('count')} x {d.get('kind')} in {d.get('processes')} process(es){mesh}"


def record_start(workdir: str, resumed_from_step: int | None,
                 config_changes: dict | None = None, devices: dict | None = None,
                 stage: str | None = None, data: dict | None = None,
                 seed_axis: str | None = None) -> dict:
  """Appends this start (time, resumed step, host, devices and mesh, versions, code, and the
  changes from the previous start that train.allow_config_change let through) to
  workdir/run_info.json, whose "starts" list then tells which code, machine and settings
  produced which part of the run; with `stage`, `data` and `seed_axis` also the stage's name,
  its data files' fingerprints and a seeds run's --seed_axis (resume_guards.py). A damaged
  record (let through by the caller) is first kept as run_info.json.damaged."""
  path = files.path(workdir, "run_info.json")
  info, problem = _read_json(workdir, "run_info.json")
  if info is None or not isinstance(info.get("starts"), list):
    if problem != "missing":
      with contextlib.suppress(OSError):  # unreadable: nothing to keep
        files.path(workdir, "run_info.json.damaged").write_bytes(path.read_bytes())
    info = {"starts": []}
  entry = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "resumed_from_step": resumed_from_step, "host": platform.node(),
           "devices": devices, "versions": package_versions(),
           **code_version(), "config_changes": config_changes or {},
           **({"stage": stage} if stage else {}), **({"data_files": data} if data else {}),
           **({"seed_axis": seed_axis} if seed_axis else {})}
  info["starts"] = [*info["starts"], entry]
  files.write_atomic(path, json.dumps(info, indent=2))
  return entry


# ----------------------------------------------------------------------------- one lifecycle


def open_records(configs, workdirs, resuming: bool, devices: dict, log=print, free: tuple = (),
                 missing_ok: bool = False, stage: str | None = None,
                 data: dict | None = None, checkpoints: str | None = None,
                 length: tuple = ("train.steps",), seed_axis: str | None = None) -> list[dict]:
  """The first half of every stage's start (RL, SFT, RM, DPO, Training-Free GRPO), inside its
  workdir lock: when `resuming` (the workdir holds checkpoints), the config and devices are
  checked against the workdir's record (`check_resume_config`); nothing is written (the configs
  are, by `resume_records`, once a checkpoint restored: a restore that fails leaves
  config.json as it was). Returns each workdir's changes for `resume_records`. `stage` and
  `data` (its data files' fingerprints): another stage's checkpoints and a rewritten data file
  are refused too; `checkpoints` (the stage's checkpoint folder, default workdir/checkpoints):
  records that stop short of its newest step (resume_guards.py). `length`: the fields of the
  stage's length (free under optim.schedule 'constant' only); `seed_axis`: a seeds run's
  --seed_axis, refused when it differs from the recorded one (resume_guards.py)."""
  from grpo_jax.train.run import resume_guards  # noqa: PLC0415
  allow = bool(configs[0].train.allow_config_change)
  changes = [{} for _ in workdirs]
  if resuming:
    for wd in workdirs:
      resume_guards.check_stage(wd, stage)
      resume_guards.check_records_reach_checkpoint(wd, checkpoints)
    changes = [{**config_changes(c, wd, allow), **record_changes(wd, devices, allow, missing_ok),
                **resume_guards.data_changes(wd, data, allow),
                **resume_guards.seed_axis_changes(wd, seed_axis, allow)}
               for c, wd in zip(configs, workdirs)]
    schedule = configs[0].optim.get("schedule", "constant")
    for wd, changed in zip(workdirs, changes):
      check_resume_config(changed, wd, allow, log, free, length, schedule)
  return changes


def resume_records(workdirs, configs, step: int | None, changes: list, devices: dict,
                   stage: str | None = None, data: dict | None = None,
                   seed_axis: str | None = None) -> list[int]:
  """The second half, once the newest checkpoint is restored (step) or none is (None): each
  workdir's config written, the start recorded in run_info.json and the records trimmed to
  the step (metrics.jsonl and samples.jsonl: a run killed after its last checkpoint wrote
  records the resumed run writes again). Returns the metrics lines dropped per workdir."""
  dropped = []
  for c, wd in zip(configs, workdirs):
    write_config(c, wd)
  for wd, changed in zip(workdirs, changes):
    record_start(wd, step, changed, devices, stage, data, seed_axis)
    dropped.append(keep_records_until(files.path(wd, "metrics.jsonl"),
                                      -1 if step is None else step))
    if files.exists(files.path(wd, "samples.jsonl")):
      keep_records_until(files.path(wd, "samples.jsonl"), -1 if step is None else step)
  return dropped
