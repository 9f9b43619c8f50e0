"""Does the tiny vision-language policy learn to see? configs/grpo_vision_tiny.py (a random
Qwen2.5-VL-layout model, GRPO from scratch on "which bar is taller, L or R?") against the same
recipe with every image blanked (task.blank=True, one grey): issue 57, must-show 3.

    python benchmarks/vision_learns.py [--seeds 0] [--arms images,blank] [--workdir DIR]
        [-- extra --config.x=y overrides for every run]

Each arm is the user's command, `python -m grpo_jax.main --config=configs/grpo_vision_tiny.py
--workdir=DIR/<arm>_seed<s> --config.seed=s`, timed whole (start-up and compilation included).
Printed: per run its held-out accuracy at every evaluation (metrics.jsonl's eval_accuracy), and
one JSON line {"arm", "seed", "eval_accuracy_first", "eval_accuracy_best", "eval_accuracy_last",
"lift", "wall_s"} (lift = last - first). A policy blind to the image scores 0.5 at best: the
blank arm shows that ceiling, the images arm's excess over it is what seeing adds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = {"images": [], "blank": ["--config.task.blank=True"]}


def accuracies(workdir: str) -> list:
  """[(step, eval_accuracy)] of a run's metrics.jsonl."""
  out = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      if "eval_accuracy" in record:
        out.append((record["step"], record["eval_accuracy"]))
  return out


def run(arm: str, seed: int, workdir: str, extra: list) -> dict:
  folder = os.path.join(workdir, f"{arm}_seed{seed}")
  command = [sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_vision_tiny.py",
             f"--workdir={folder}", f"--config.seed={seed}"] + ARMS[arm] + extra
  started = time.perf_counter()
  with open(folder + ".log", "w") as log:
    subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
  wall = time.perf_counter() - started
  curve = accuracies(folder)
  print(f"{arm} seed {seed}: " + ", ".join(f"{s}: {a:.3f}" for s, a in curve)
        + f" ({wall:.0f} s)")
  return {"arm": arm, "seed": seed, "eval_accuracy_first": curve[0][1],
          "eval_accuracy_best": max(a for _, a in curve), "eval_accuracy_last": curve[-1][1],
          "lift": curve[-1][1] - curve[0][1], "wall_s": round(wall, 1)}


def main() -> None:
  argv = sys.argv[1:]
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  argv = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seeds", default="0")
  parser.add_argument("--arms", default="images,blank")
  parser.add_argument("--workdir", default="")
  args = parser.parse_args(argv)
  workdir = args.workdir or tempfile.mkdtemp(prefix="vision_learns_")
  os.makedirs(workdir, exist_ok=True)
  results = [run(arm, int(seed), workdir, extra) for seed in args.seeds.split(",")
             for arm in args.arms.split(",")]
  for r in results:
    print(json.dumps(r))


if __name__ == "__main__":
  main()
