"""S seeds of one config: S separate processes (one after another) against one process running
them as one program (--vmap_seeds, seed_axis vmap and map). Prints wall times and whether each
seed's metrics equal its separate run (bit for bit, wall-clock fields aside).

    python benchmarks/seeds.py [--seeds 0 1 2] [extra --config.x=y flags]

Default: configs/grpo_tiny.py shortened to 300 warm-up and 40 RL steps so that it takes a few
minutes on a 2-core CPU.
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

SHORT = ["--config.warmup.steps=300", "--config.train.steps=40", "--config.train.eval_every=20",
         "--config.train.eval_size=200", "--config.train.eval_batch_size=100"]


def _records(path):
  with open(path) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in f]


def _timed(args):
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
                  *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args()
  flags = SHORT + args.overrides
  seeds = ",".join(map(str, args.seeds))
  print(f"configs/grpo_tiny.py {' '.join(flags)}; seeds {args.seeds}")
  with tempfile.TemporaryDirectory() as tmp:
    separate = sum(_timed([f"--workdir={tmp}/sep{s}", f"--config.seed={s}", *flags])
                   for s in args.seeds)
    rows = [("separate processes, one after another", separate, "reference")]
    for axis in ("vmap", "map"):
      wall = _timed([f"--workdir={tmp}/{axis}", f"--vmap_seeds={seeds}", f"--seed_axis={axis}",
                     *flags])
      equal = [_records(f"{tmp}/{axis}/seed_{s}/metrics.jsonl") ==
               _records(f"{tmp}/sep{s}/metrics.jsonl") for s in args.seeds]
      rows.append((f"one process, --seed_axis={axis}", wall,
                   f"{sum(equal)}/{len(equal)} seeds bit-identical"))
  print("| how | wall s (all seeds) | speed-up | metrics vs separate runs |")
  print("|---|---|---|---|")
  for name, wall, note in rows:
    print(f"| {name} | {wall:.0f} | {separate / wall:.2f}x | {note} |")


if __name__ == "__main__":
  main()
