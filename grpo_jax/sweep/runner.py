"""Running a sweep's jobs: locally (one after another, or N processes at once) or printed as
commands for a cluster. A run that finished has WORKDIR/<arm>/seed_<s>/DONE.json and is skipped
when the sweep runs again; a run that was stopped part-way resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

from grpo_jax.sweep.spec import Job, Sweep, jobs, run_dir

DONE_FILE = "DONE.json"


def is_done(sweep_dir: str, arm, seed: int) -> bool:
  return os.path.exists(os.path.join(run_dir(sweep_dir, arm, seed), DONE_FILE))


def pending_jobs(sweep: Sweep, sweep_dir: str) -> tuple[list[Job], int]:
  """(jobs for the runs without DONE.json, number of finished runs skipped)."""
  todo, skipped = {}, 0
  for arm in sweep.arms:
    missing = [s for s in sweep.seeds if not is_done(sweep_dir, arm, s)]
    skipped += len(sweep.seeds) - len(missing)
    todo[arm.name] = missing
  return jobs(sweep, sweep_dir, todo), skipped


def command_line(job: Job) -> str:
  return " ".join(shlex.quote(part) for part in job.command)


WALL_FILE = "sweep_wall_s.json"  # the seconds of every process a job has run, stops included


def _add_wall(job: Job, wall_s: float) -> float:
  """Adds a process's seconds to the job's record; returns the job's total so far (a job
  stopped and run again reports both processes' time, not the last one's)."""
  path = os.path.join(job.workdir, WALL_FILE)
  try:
    with open(path) as f:
      spent = [float(x) for x in json.load(f)]
  except (OSError, ValueError, TypeError):
    spent = []
  spent.append(round(wall_s, 3))
  with open(path, "w") as f:
    json.dump(spent, f)
  return sum(spent)


def _mark_done(job: Job, sweep_dir: str, wall_s: float) -> None:
  record = {"wall_s": wall_s, "seeds_in_process": len(job.seeds), "command": command_line(job)}
  for seed in job.seeds:
    with open(os.path.join(run_dir(sweep_dir, job.arm, seed), DONE_FILE), "w") as f:
      json.dump(record, f, indent=2)


class SweepStopped(Exception):
  """SIGTERM or SIGINT reached the launcher; its running jobs were stopped first."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def run_jobs(job_list: list[Job], sweep_dir: str, cwd: str, parallel: int = 1,
             log=print) -> list[Job]:
  """Runs the jobs, at most `parallel` at a time, each writing its output to
  <workdir>/sweep_job.log; returns the jobs that failed (the others are marked done). SIGTERM or
  SIGINT to the launcher is passed to its running jobs, which save their step and exit; it
  waits for them, then raises SweepStopped (no job is left running, orphaned)."""
  waiting, running, failed = list(job_list), [], []

  def stop(signum, frame):
    del frame
    raise SweepStopped(signum)
  previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    while waiting or running:
      while waiting and len(running) < parallel:
        job = waiting.pop(0)
        os.makedirs(job.workdir, exist_ok=True)
        out = open(os.path.join(job.workdir, "sweep_job.log"), "a")  # noqa: SIM115
        log(f"start  {job.arm.name} seeds {list(job.seeds)}")
        process = subprocess.Popen([sys.executable, *job.command[1:]], cwd=cwd, stdout=out,
                                   stderr=subprocess.STDOUT)
        running.append((job, process, out, time.perf_counter()))
      time.sleep(0.2)
      for entry in list(running):
        job, process, out, start = entry
        if process.poll() is None:
          continue
        running.remove(entry)
        out.close()
        wall = _add_wall(job, time.perf_counter() - start)
        if process.returncode == 0:
          _mark_done(job, sweep_dir, wall)
          log(f"done   {job.arm.name} seeds {list(job.seeds)} in {wall:.0f} s")
        else:
          failed.append(job)
          log(f"FAILED {job.arm.name} seeds {list(job.seeds)} (exit {process.returncode}); "
              f"see {os.path.join(job.workdir, 'sweep_job.log')}")
  except SweepStopped:
    for s, handler in previous.items():  # a second signal now ends the wait
      signal.signal(s, handler)
    for job, process, out, start in running:
      process.send_signal(signal.SIGTERM)  # the job saves its current step and exits
    for job, process, out, start in running:
      process.wait()
      out.close()
      _add_wall(job, time.perf_counter() - start)
    raise
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  return failed
