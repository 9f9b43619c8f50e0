"""Stopping a run from outside: Ctrl-C (SIGINT) saves and exits like SIGTERM, a signal during
the warm-up stops within seconds, and a disk that fills during a save ends the run with one
sentence, the previous checkpoint intact and resumable."""

import os
import shutil
import signal
import subprocess

import pytest

from grpo_jax.train.run import faults
from tests.tiny_runs import ROOT, command, records, start_and_signal, strip


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_sigint_or_sighup_saves_the_step_and_the_resume_equals_the_uninterrupted_run(
    reference, tmp_path, env, sig):
  """Ctrl-C, or SIGHUP (the terminal or ssh session that started the run closed), saves like
  SIGTERM; the resume prints nothing on stderr (no orbax warning lines), and its elapsed_s
  counts on from the stopped process's. Both signals reach
  the one handler (train/run/faults.py), so SIGHUP's resume is SIGINT's: it is run once."""
  _, ref_records = reference
  workdir = tmp_path / "run"
  code, stderr, _ = start_and_signal(workdir, env, sig, 2, 0.0,
                                     "--config.train.checkpoint_every=100")
  assert code == 128 + sig, stderr[-2000:]
  assert faults.INTERRUPTED_EXIT_CODE == 130
  stopped, before = records(workdir)[-1]["step"], records(workdir)[-1]["elapsed_s"]
  assert stderr.strip().splitlines() == [
      f"{signal.Signals(sig).name}: saved checkpoint {workdir}/checkpoints/{stopped}; run the "
      f"same command again to resume from it."]
  if sig == signal.SIGHUP:
    return
  out = subprocess.run(command(workdir, "--config.train.checkpoint_every=100"), cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0 and out.stderr == "", out.stderr[-2000:]
  assert f"resumed from checkpoint {workdir}/checkpoints/{stopped}" in out.stdout
  assert strip(records(workdir)) == strip(ref_records)
  assert records(workdir)[stopped + 1]["elapsed_s"] > before  # the run's clock counts on


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stdout_closed_midway", "stderr_closed_at_start"])
def test_a_console_closed_under_the_run_does_not_stop_it(reference, tmp_path, env, how):
  """Standard output closed after the first line (a closed terminal, `| head -1`), or standard
  error closed from the start (`2>&-`, which made the first save fail): the run goes on to the
  end, exits 0, and its records equal the uninterrupted run's."""
  _, ref_records = reference
  workdir = tmp_path / "run"
  if how == "stdout_closed_midway":
    proc = subprocess.Popen(command(workdir), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline()
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=600)
    assert stderr == ""
  else:
    proc = subprocess.run(command(workdir), cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          env=env, timeout=600, preexec_fn=lambda: os.close(2))
    stderr = proc.stdout
  assert proc.returncode == 0, stderr[-3000:]
  assert strip(records(workdir)) == strip(ref_records)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_during_the_warm_up_stops_within_seconds(tmp_path, env, sig):
  """A warm-up of 10^6 steps (hours) stopped by the signal: the run ends at the end of the
  warm-up step in flight, well within a TPU VM's ~30 s notice, with nothing saved (a resume
  runs the warm-up again: it is a pure function of the seed)."""
  workdir = tmp_path / "run"
  code, stderr, waited = start_and_signal(workdir, env, sig, "model:", 2.0,
                                          "--config.warmup.steps=1000000")
  assert code == 128 + sig, stderr[-2000:]
  assert stderr.strip().splitlines() == [
      f"{signal.Signals(sig).name}: stopped during the warm-up, before the first checkpoint; "
      f"run the same command again to start over (the warm-up is a pure function of the seed)."]
  assert waited < 30, f"{waited:.1f} s from the signal to the exit"
  assert not os.listdir(workdir / "checkpoints")
  print(f"{signal.Signals(sig).name} during the warm-up: exit {waited:.2f} s after the signal")


def _mount_tmpfs(path, size: str) -> bool:
  path.mkdir()
  if os.geteuid() != 0 or shutil.which("mount") is None:
    return False
  out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True)
  return out.returncode == 0


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_one_line_and_the_previous_checkpoint_resumes(
    tmp_path, env):
  """The run's workdir on a 6 MiB file system: checkpoint 0 (4.4 MiB) fits, checkpoint 1 does
  not. One sentence, exit 1, what the failed save left removed; the workdir, moved to a disk
  with space, restores checkpoint 0 without a warning (a resume from an intact checkpoint 0
  reproducing the uninterrupted run is test_checkpoint.py's damaged-folders test)."""
  from grpo_jax.train.run.checkpoint import Checkpoints  # noqa: PLC0415
  from tests.tiny_runs import template  # noqa: PLC0415
  small = tmp_path / "small_disk"
  if not _mount_tmpfs(small, "6m"):
    pytest.skip("mounting a small tmpfs needs root and CAP_SYS_ADMIN")
  try:
    out = subprocess.run(command(small / "run", "--config.train.checkpoint_every=1"), cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        f"error: the checkpoint of step 1 could not be saved (the disk is full); the previous "
        f"checkpoint {small}/run/checkpoints/0 is intact, so free some space and run the same "
        f"command again to resume from it."]
    assert os.listdir(small / "run" / "checkpoints") == ["0"]
    shutil.copytree(small / "run", tmp_path / "run")
  finally:
    subprocess.run(["umount", str(small)], check=False)
  ckpts = Checkpoints(tmp_path / "run" / "checkpoints", 3, log=(logged := []).append)
  assert int(ckpts.restore_latest(template()).step) == 0 and not logged
  ckpts.close()
