"""The RL step's time on a run without signal (issue 76): every reward 0, every group tied,
so every gradient is exactly zero. With rl.skip_without_signal (the default) the update runs
the forward and leaves out the backward (and the optimizer step); with it off, the update runs
both, for nothing. Both runs in one invocation, one after the other, on the same machine.

    python benchmarks/no_signal_step.py [--steps 20] [extra --config.x=y flags]

Default: the calculator demo's control (configs/grpo_calculator_tiny.py, env.tools=False:
no tool, so no episode can earn its reward) after a 20-step warm-up. Prints one JSON line per
setting with the keys skip_without_signal, update_s_median, step_s_median, steps,
no_signal_updates, then the saving.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import header  # noqa: E402

BASE = ["--config=configs/grpo_calculator_tiny.py", "--config.env.tools=False",
        "--config.warmup.steps=20", "--config.train.eval_size=16",
        "--config.train.eval_batch_size=16", "--config.train.num_samples=0",
        "--config.train.checkpoint_every=0"]


def run(skip: bool, steps: int, extra: list, tmp: str) -> dict:
  workdir = os.path.join(tmp, f"skip_{skip}")
  subprocess.run([sys.executable, "-m", "grpo_jax.main", *BASE, f"--workdir={workdir}",
                  f"--config.train.steps={steps}", f"--config.train.eval_every={steps}",
                  f"--config.rl.skip_without_signal={skip}", *extra],
                 cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  steady = [r for r in records if r["step"] > 1 and "time_update_s" in r]  # step 1 compiles
  return dict(skip_without_signal=skip,
              update_s_median=round(statistics.median(r["time_update_s"] for r in steady), 4),
              step_s_median=round(statistics.median(r["step_time_s"] for r in steady), 4),
              steps=len(steady), tied=all(r["frac_groups_all_same"] == 1.0 for r in steady),
              no_signal_updates=int(records[-1].get("no_signal_updates", 0)))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  print(header())
  with tempfile.TemporaryDirectory() as tmp:
    rows = [run(skip, args.steps, args.overrides, tmp) for skip in (False, True)]
  for row in rows:
    print(json.dumps(row))
  off, on = rows
  print(json.dumps(dict(update_saved=round(1 - on["update_s_median"] / off["update_s_median"],
                                           3),
                        step_saved=round(1 - on["step_s_median"] / off["step_s_median"], 3))))


if __name__ == "__main__":
  main()
