"""Runs the README's main command (configs/grpo_tiny.py) for some seeds and prints, per seed
(with --config, the same for ppo_tiny / dapo_tiny): wall time, the reward lift (mean
reward_mean of the last 10% of steps minus the first 10%), the eval-accuracy lift (end minus
step 0), and whether a repeat of the first seed reproduces its metrics.jsonl (wall-clock
fields aside).

    python benchmarks/tiny_learning.py --seeds 0 1 2 --repeat-first
    python benchmarks/tiny_learning.py --config configs/ppo_tiny.py --seeds 0
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
from grpo_jax.train.run.metrics import TIMING_KEYS  # noqa: E402


def run(config: str, seed: int, workdir: str, extra: list[str]) -> tuple[float, list[dict]]:
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", "grpo_jax.main", f"--config={config}",
                  f"--workdir={workdir}", f"--config.seed={seed}", *extra], cwd=ROOT,
                 check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  wall = time.perf_counter() - start
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return wall, [json.loads(line) for line in f]


def summarize(records: list[dict]) -> dict:
  steps = [r for r in records if "reward_mean" in r]
  tenth = max(len(steps) // 10, 1)
  first = sum(r["reward_mean"] for r in steps[:tenth]) / tenth
  last = sum(r["reward_mean"] for r in steps[-tenth:]) / tenth
  evals = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
  if "value_loss" in steps[0]:
    first_v = sum(r["value_loss"] for r in steps[:tenth]) / tenth
    last_v = sum(r["value_loss"] for r in steps[-tenth:]) / tenth
    print(f"value_loss: first 10% {first_v:.4f} -> last 10% {last_v:.4f}")
  return dict(reward_first10=first, reward_last10=last, reward_lift=last - first,
              eval_start=evals[0], eval_end=evals[-1], eval_lift=evals[-1] - evals[0])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--config", default="configs/grpo_tiny.py")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--repeat-first", action="store_true")
  parser.add_argument("overrides", nargs="*", help="extra --config.x=y flags")
  args = parser.parse_args()
  print(f"{args.config} {' '.join(args.overrides)}")
  print("| seed | wall s | reward first 10% | last 10% | lift | eval step 0 | eval end | lift |")
  print("|---|---|---|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as tmp:
    results = {}
    for seed in args.seeds:
      wall, records = run(args.config, seed, os.path.join(tmp, f"s{seed}"), args.overrides)
      results[seed] = records
      s = summarize(records)
      print(f"| {seed} | {wall:.0f} | {s['reward_first10']:.3f} | {s['reward_last10']:.3f} | "
            f"{s['reward_lift']:+.3f} | {s['eval_start']:.3f} | {s['eval_end']:.3f} | "
            f"{s['eval_lift']:+.3f} |", flush=True)
    if args.repeat_first:
      seed = args.seeds[0]
      _, again = run(args.config, seed, os.path.join(tmp, "repeat"), args.overrides)
      strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rs]  # noqa
      same = strip(again) == strip(results[seed])
      print(f"repeat of seed {seed}: metrics.jsonl identical (wall-clock fields aside): {same}")


if __name__ == "__main__":
  main()
