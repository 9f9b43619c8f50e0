"""One run per advantage estimator on the tiny addition task (configs/grpo_tiny.py, only
rl.advantage changed; `gae` also gets a shared value head), printed as a markdown table:
final reward (mean reward_mean of the last 10% of steps), eval accuracy (greedy, held-out) at
step 0 and at the end, and wall time.

    python benchmarks/ablation.py [--seed 0] [extra --config.x=y flags]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import grpo_jax.builtins  # noqa: E402,F401  every built-in estimator registered
from grpo_jax.rl.estimators import ESTIMATORS  # noqa: E402

EXTRA = {"gae": ["--config.rl.value_head=shared"]}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  print(f"configs/grpo_tiny.py seed {args.seed} {' '.join(args.overrides)}")
  print("| rl.advantage | final reward (last 10%) | eval acc step 0 | eval acc end | wall s |")
  print("|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as tmp:
    for name in ESTIMATORS.names():
      workdir = os.path.join(tmp, name)
      start = time.perf_counter()
      subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
                      f"--workdir={workdir}", f"--config.seed={args.seed}",
                      f"--config.rl.advantage={name}", *EXTRA.get(name, []), *args.overrides],
                     cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      wall = time.perf_counter() - start
      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
      steps = [r["reward_mean"] for r in records if "reward_mean" in r]
      tenth = max(len(steps) // 10, 1)
      evals = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
      print(f"| {name} | {sum(steps[-tenth:]) / tenth:.3f} | {evals[0]:.3f} | {evals[-1]:.3f} "
            f"| {wall:.0f} |", flush=True)


if __name__ == "__main__":
  main()
