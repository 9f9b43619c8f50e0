"""Runs a sweep of ablations over seeds, then writes its table and plots.

    python launch/sweep.py --sweep=configs/sweeps/estimators_tiny.py [--workdir=DIR]
        [--parallel=N] [--print_commands] [--report_only]

Runs go to WORKDIR/<arm>/seed_<s>/ (default WORKDIR: sweeps/<sweep file name>); finished runs
(DONE.json) are skipped when the sweep runs again, and a run stopped part-way resumes from its
checkpoint. Before any job starts (or is printed), every pending arm's config is built and
validated as its process would (grpo_jax/sweep/checks.py): a bad field or value stops the sweep
in one sentence naming the arm. --print_commands prints one command per pending job (for a
cluster scheduler) and runs nothing. The report: WORKDIR/{runs.csv, results.csv, results.md,
reward_mean.png, eval_accuracy.png, eval_accuracy_wall.png} (grpo_jax/sweep/report.py says
what each figure is).
docs/sweeps.md is the guide.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from grpo_jax.sweep.checks import check_arms  # noqa: E402
from grpo_jax.sweep.report import write_report  # noqa: E402
from grpo_jax.sweep.runner import SweepStopped, command_line, pending_jobs, run_jobs  # noqa: E402
from grpo_jax.sweep.spec import SEED_AXES, SweepError, load_sweep  # noqa: E402


def _writable(sweep_dir: str) -> bool:
  """Whether the sweep's folder can be written; one sentence when not (round 5's W10: a
  read-only workdir was a 13-line traceback)."""
  try:
    os.makedirs(sweep_dir, exist_ok=True)
    if not os.access(sweep_dir, os.W_OK):
      raise PermissionError(13, "Permission denied")
  except OSError as e:
    print(f"error: the sweep's workdir {sweep_dir} cannot be written ({e.strerror or e}); pass "
          f"a writable --workdir.", file=sys.stderr)
    return False
  return True


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sweep", required=True, help="a sweep file (configs/sweeps/*.py)")
  parser.add_argument("--workdir", help="default: sweeps/<sweep file name>")
  parser.add_argument("--parallel", type=int, default=1, help="processes at once")
  parser.add_argument("--print_commands", action="store_true",
                      help="print the pending jobs' commands and run nothing")
  parser.add_argument("--report_only", action="store_true", help="only write the report")
  parser.add_argument("--seed_axis", choices=SEED_AXES,
                      help="override the sweep file's seed_axis")
  args = parser.parse_args(argv)
  try:
    sweep = load_sweep(args.sweep, args.seed_axis)  # the override checked like the file's
  except SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.parallel < 1:
    print(f"error: --parallel={args.parallel}; use 1 or more processes.", file=sys.stderr)
    return 2
  sweep_dir = os.path.abspath(args.workdir or os.path.join("sweeps", sweep.name))
  failed = []
  if args.report_only and not _writable(sweep_dir):
    return 2
  if not args.report_only:
    todo, skipped = pending_jobs(sweep, sweep_dir)
    try:
      check_arms(sweep, sweep_dir, cwd=ROOT, pending=todo)
    except SweepError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    if args.print_commands:
      for job in todo:
        print(command_line(job))
      return 0
    if not _writable(sweep_dir):
      return 2
    runs = sum(len(j.seeds) for j in todo)
    print(f"sweep {sweep.name}: {len(sweep.arms)} arms x {len(sweep.seeds)} seeds; "
          f"{skipped} finished run(s) skipped, {runs} to run in {len(todo)} process(es) "
          f"({args.parallel} at a time) under {sweep_dir}", flush=True)
    try:
      failed = run_jobs(todo, sweep_dir, cwd=ROOT, parallel=args.parallel,
                        log=lambda m: print(m, flush=True))
    except SweepStopped as e:
      print(f"stopped by signal {e.signum}: the running jobs were stopped and saved their "
            f"step; run the same command again to resume them.", file=sys.stderr, flush=True)
      return 128 + e.signum
  try:
    written = write_report(sweep, sweep_dir)
  except SweepError as e:  # a finished run's DONE.json damaged
    print(f"error: {e}", file=sys.stderr)
    return 2
  for path in written:
    print(f"wrote {path}")
  if failed:
    print(f"error: {len(failed)} job(s) failed; run the same command again to retry them.",
          file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
