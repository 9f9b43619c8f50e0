"""The run's record (config.json, run_info.json) is checked like its checkpoints: a workdir with
checkpoints whose record is missing or damaged, or that is resumed on other devices, stops in
one sentence with nothing rewritten; train.allow_config_change lets it through, says what it
let through, and keeps a damaged record aside. Permissions on checkpoints are found before any
compute (an unreadable checkpoint is never taken for a damaged one: tests/test_faults.py)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from grpo_jax.main import cli
from grpo_jax.train.run import workdir as workdir_lib
from tests.tiny_runs import N, command



def _argv(workdir, *extra):
  return [a for a in command(workdir, *extra)[3:]]


def _snapshot(folder):
  return {p: (folder / p).read_bytes() for p in sorted(os.listdir(folder))
          if (folder / p).is_file() and p != ".lock"}  # .lock: the PID of the last holder


def _refused(capfd, workdir, *needles, extra=()):
  before = _snapshot(workdir)
  code = cli(_argv(workdir, *extra))
  err = capfd.readouterr().err
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
  for needle in needles:
    assert needle in lines[0], (needle, lines[0])
  assert _snapshot(workdir) == before, "the workdir's record changed"
  return lines[0]


@pytest.fixture
def copy(reference, tmp_path):
  ref_dir, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("case", ["config_missing", "config_damaged", "config_not_object",
                                  "config_not_utf8", "info_missing", "info_damaged",
                                  "info_without_starts"])
def test_a_missing_or_damaged_record_is_one_sentence_and_nothing_is_rewritten(capfd, copy,
                                                                              case):
  name = "config.json" if case.startswith("config") else "run_info.json"
  path = copy / name
  if case.endswith("missing"):
    path.unlink()
    what = "is missing"
  elif case.endswith("damaged"):
    path.write_text(path.read_text()[:40])  # cut short
    what = "is damaged (JSONDecodeError"
  elif case.endswith("utf8"):
    path.write_bytes(b"\xff\xfe{}")
    what = "is damaged (UnicodeDecodeError"
  else:
    path.write_text("[1, 2]" if name == "config.json" else '{"starts": 3}')
    what = "is damaged ("
  line = _refused(capfd, copy, f"{copy}/{name} {what}",
                  "pass --config.train.allow_config_change=True")
  # Said as what it is, never as a config change.
  assert "differs from its config.json" not in line


@pytest.mark.slow
def test_allow_config_change_lets_a_damaged_record_through_says_so_and_keeps_it(capfd, copy):
  (copy / "config.json").unlink()
  damaged = (copy / "run_info.json").read_text()[:40]
  (copy / "run_info.json").write_text(damaged)
  code = cli(_argv(copy, f"--config.train.steps={2 * N + 1}",
                   "--config.train.allow_config_change=True"))
  out = capfd.readouterr().out
  assert code == 0
  assert (f"resuming {copy} with changes allowed by train.allow_config_change: config.json "
          f"\"missing\" -> \"rewritten\", run_info.json \"damaged\" -> \"new record\"") in out
  assert (copy / "run_info.json.damaged").read_text() == damaged
  starts = json.loads((copy / "run_info.json").read_text())["starts"]
  assert len(starts) == 1 and starts[0]["resumed_from_step"] == 2 * N
  assert starts[0]["config_changes"] == {"config.json": ["missing", "rewritten"],
                                         "run_info.json": ["damaged", "new record"]}
  assert starts[0]["devices"] == {"platform": "cpu", "kind": "cpu", "count": 1, "processes": 1,
                                  "mesh": [1, 1, 1, 1, 1]}
  assert starts[0]["host"]
  assert json.loads((copy / "config.json").read_text())["train"]["steps"] == 2 * N + 1


@pytest.mark.slow
def test_a_resume_on_other_devices_is_refused_naming_both(capfd, copy):
  info = json.loads((copy / "run_info.json").read_text())
  assert info["starts"][-1]["devices"]["count"] == 1  # recorded at every start
  info["starts"][-1]["devices"].update(count=2, mesh=[2, 1, 1, 1, 1])
  (copy / "run_info.json").write_text(json.dumps(info))
  _refused(capfd, copy, f"resuming {copy} on other devices than its last start (1 x cpu in 1 "
           f"process(es), mesh (1, 1, 1, 1, 1) now, 2 x cpu in 1 process(es), mesh "
           f"(2, 1, 1, 1, 1) then)", "losses would differ by rounding")


@pytest.mark.slow
@pytest.mark.parametrize("what", ["readable", "writable"])
def test_checkpoints_this_user_cannot_use_are_found_before_any_compute(capfd, copy, monkeypatch,
                                                                      what):
  """(As root, as CI runs, permissions cannot be taken away: os.access is made to say no.)"""
  folder = str(copy / "checkpoints")
  real = os.access
  denied = os.R_OK if what == "readable" else os.W_OK
  target = folder if what == "writable" else os.path.join(folder, str(N))
  monkeypatch.setattr(workdir_lib.os, "access", lambda p, mode: not (
      os.path.abspath(p) == target and mode & denied) and real(p, mode))
  _refused(capfd, copy, f"{target} is not {what} by this user", f"chmod -R u+rwX {folder}")


@pytest.mark.slow
def test_the_record_of_a_fresh_workdir_holds_devices_and_host(reference):
  ref_dir, _ = reference
  start = json.loads((ref_dir / "run_info.json").read_text())["starts"][0]
  assert set(start) >= {"time", "resumed_from_step", "host", "devices", "versions",
                        "git_commit", "config_changes"}
  assert start["devices"]["count"] == 1 and np.isscalar(start["devices"]["processes"])


def test_a_record_without_usable_devices_or_an_old_stage_record_is_no_change(tmp_path):
  """Starts whose "devices" is not an object (damaged by hand) are skipped, not a crash; the
  SFT and RM stages wrote no run_info.json before, so theirs may be missing."""
  now = {"platform": "cpu", "kind": "cpu", "count": 1, "processes": 1, "mesh": None}
  (tmp_path / "run_info.json").write_text(json.dumps({"starts": [{"devices": "2 x cpu"}]}))
  assert workdir_lib.record_changes(str(tmp_path), now) == {}
  (tmp_path / "run_info.json").unlink()
  assert workdir_lib.record_changes(str(tmp_path), now, missing_ok=True) == {}
  with pytest.raises(workdir_lib.RecordDamaged):
    workdir_lib.record_changes(str(tmp_path), now)


def test_nohup_keeps_sighup_ignored():
  """Under `nohup` (SIGHUP ignored) the run outlives its terminal: the flag does not take
  SIGHUP over; otherwise SIGHUP saves and stops like SIGTERM."""
  import signal  # noqa: PLC0415
  from grpo_jax.train.run.faults import TerminationFlag  # noqa: PLC0415
  previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
  try:
    with TerminationFlag():
      assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
      assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    with TerminationFlag() as flag:
      assert signal.getsignal(signal.SIGHUP) == flag._handle
  finally:
    signal.signal(signal.SIGHUP, previous)


def test_a_console_that_cannot_show_a_character_escapes_it_and_a_closed_one_is_dropped():
  import io  # noqa: PLC0415
  from grpo_jax.console import SurvivingStream  # noqa: PLC0415
  raw = io.BytesIO()
  stream = SurvivingStream(io.TextIOWrapper(raw, encoding="ascii"))
  stream.writelines(["3 + 4 = 7 \u2713\n"])
  stream.flush()
  assert raw.getvalue() == b"3 + 4 = 7 \\u2713\n" and not stream.closed_under_us

  class Closed(io.StringIO):
    def write(self, text):
      raise BrokenPipeError(32, "Broken pipe")
  dead = SurvivingStream(Closed())
  assert dead.write("step 1\n") == 7 and dead.closed_under_us
  dead.write("step 2\n")  # dropped, no error


def test_only_a_platform_choice_is_blamed_on_jax_platforms(monkeypatch):
  import jax  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from grpo_jax.parallel import platform  # noqa: PLC0415
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  def fail(message):
    def devices():
      raise RuntimeError(message)
    return devices
  monkeypatch.setattr(jax, "devices", fail("DEADLINE_EXCEEDED: barrier timed out"))
  with pytest.raises(RuntimeError, match="barrier timed out"):
    platform.start_backend()
  monkeypatch.setattr(jax, "devices", fail("Unable to initialize backend 'cuda': no GPU"))
  with pytest.raises(ConfigError, match="names a platform|the platform that JAX cannot start"):
    platform.start_backend()


def test_compilation_cache_folder_by_setting_and_platform(monkeypatch):
  from grpo_jax.parallel.platform import compilation_cache_dir  # noqa: PLC0415
  monkeypatch.delenv("GRPO_JAX_COMPILATION_CACHE", raising=False)
  home = os.path.expanduser(os.path.join("~", ".cache", "grpo_jax", "xla"))
  assert compilation_cache_dir("auto", "cpu") is None
  assert compilation_cache_dir("auto", "gpu") == home
  assert compilation_cache_dir("auto", "tpu") == home
  assert compilation_cache_dir("", "gpu") is None
  assert compilation_cache_dir("/data/xla", "cpu") == "/data/xla"
  monkeypatch.setenv("GRPO_JAX_COMPILATION_CACHE", "/scratch/xla")
  assert compilation_cache_dir("auto", "gpu") == "/scratch/xla"


@pytest.mark.parametrize("user_dir", [False, True])
def test_a_compilation_lands_in_the_configured_cache(tmp_path, user_dir):
  """start_backend(folder) makes the process's compilations persistent there; a user's own
  JAX_COMPILATION_CACHE_DIR wins over train.compilation_cache."""
  ours, theirs = tmp_path / "ours", tmp_path / "theirs"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if user_dir:
    env["JAX_COMPILATION_CACHE_DIR"] = str(theirs)
  code = ("import jax, jax.numpy as jnp; from grpo_jax.parallel import platform; "
          f"platform.start_backend({str(ours)!r}); "
          "print(jax.jit(lambda x: jnp.sin(x) * 3 + 1)(jnp.ones(5)).sum())")
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  written, unused = (theirs, ours) if user_dir else (ours, theirs)
  assert written.is_dir() and any(written.iterdir())
  assert not unused.exists()


def test_a_mesh_recorded_before_the_expert_axis_is_the_same_mesh(tmp_path):
  """Runs started before the mesh had an expert axis recorded three sizes, and before the
  context axis four; resuming them on the same devices (the new axes 1) is no change, while
  another mesh still is."""
  now = {"platform": "cpu", "kind": "cpu", "count": 2, "processes": 1, "mesh": [2, 1, 1, 1, 1]}
  for sizes in ([2, 1, 1], [2, 1, 1, 1]):
    old = {**now, "mesh": sizes}
    (tmp_path / "run_info.json").write_text(json.dumps({"starts": [{"devices": old}]}))
    assert workdir_lib.record_changes(str(tmp_path), now) == {}
  other = {**now, "mesh": [1, 2, 1, 1, 1]}
  assert workdir_lib.record_changes(str(tmp_path), other) == {
      "devices": [{**old, "mesh": [2, 1, 1, 1, 1]}, other]}


def test_a_resume_whose_restore_fails_leaves_config_json_as_it_was(tmp_path):
  """Resuming with another model under train.allow_config_change: no checkpoint restores and
  the run stops, but config.json already held the rejected config, so the original command
  was then refused against it. The stages check first (open_records, which writes nothing) and
  write the config once a checkpoint restored or none was there (resume_records)."""
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  now = {"platform": "cpu", "kind": "cpu", "count": 1, "processes": 1, "mesh": None}
  workdir, config = str(tmp_path), get_defaults()
  workdir_lib.write_config(config, workdir)
  workdir_lib.record_start(workdir, None, {}, now, stage="rl")
  before = (tmp_path / "config.json").read_text()
  changed = get_defaults()
  changed.model.num_layers, changed.train.allow_config_change = 3, True
  changes = workdir_lib.open_records([changed], [workdir], True, now, log=lambda *a: None,
                                     stage="rl")
  assert changes[0]["model.num_layers"] == [config.model.num_layers, 3]
  assert (tmp_path / "config.json").read_text() == before  # (the restore fails here)
  assert workdir_lib.open_records([config], [workdir], True, now,
                                  stage="rl") == [{}]  # the original command goes on
  workdir_lib.resume_records([workdir], [changed], 2, changes, now, stage="rl")
  assert json.loads((tmp_path / "config.json").read_text())["model"]["num_layers"] == 3
