"""RL steps per second of the host path vs the fused path (train.fused_steps), and of one seed
vs S vmapped seeds fused, on the tiny config. Each arm is a real `train` run; a step's time is
read from its metrics record (step_time_s), skipping the first host call (compilation) and the
last one (it evaluates); the warm-up is not timed.

    python benchmarks/fused.py [--steps 40] [--fused-steps 10] [--seeds 16]

Prints a table and one JSON line per arm: {"arm", "seeds", "fused_steps", "steps_per_s",
"seed_steps_per_s", "step_ms"}.
"""

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import grpo_tiny  # noqa: E402
from grpo_jax.host_allocator import tune_host_allocator  # noqa: E402


def _config(steps: int, fused: int):
  c = grpo_tiny.get_config()
  c.warmup.steps = 20
  c.train.steps = steps
  c.train.eval_every = steps
  c.train.eval_size = 20
  c.train.eval_batch_size = 20
  c.train.checkpoint_every = 0
  c.train.fused_steps = fused
  return c


def _arm(name: str, steps: int, fused: int, seeds: int) -> dict:
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  with tempfile.TemporaryDirectory() as workdir:
    seed_list = list(range(seeds)) if seeds > 1 else None
    with contextlib.redirect_stdout(io.StringIO()):  # the run's progress lines
      train(_config(steps, fused), workdir, log=lambda *_: None, seeds=seed_list)
    path = os.path.join(workdir, "seed_0" if seed_list else "", "metrics.jsonl")
    with open(path) as f:
      records = [json.loads(line) for line in f][1:]
  per_call = max(fused, 1)
  timed = records[per_call:-per_call]  # not the compiling call, not the evaluating one
  step_s = float(np.median([r["step_time_s"] for r in timed]))
  return dict(arm=name, seeds=seeds, fused_steps=fused, steps_per_s=1.0 / step_s,
              seed_steps_per_s=seeds / step_s, step_ms=1000.0 * step_s)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--fused-steps", type=int, default=10)
  parser.add_argument("--seeds", type=int, default=16)
  args = parser.parse_args()
  tune_host_allocator()
  k = args.fused_steps
  arms = [("host path, 1 seed", args.steps, 0, 1),
          ("fused, 1 seed", args.steps, k, 1),
          (f"fused, {args.seeds} seeds vmapped", args.steps, k, args.seeds)]
  results = [_arm(*arm) for arm in arms]
  print(f"{'arm':<28} {'step ms':>9} {'RL steps/s':>11} {'seed-steps/s':>13}")
  for r in results:
    print(f"{r['arm']:<28} {r['step_ms']:>9.1f} {r['steps_per_s']:>11.2f} "
          f"{r['seed_steps_per_s']:>13.2f}")
  host, fused, many = results
  print(f"fused / host: {fused['steps_per_s'] / host['steps_per_s']:.2f}x; "
        f"{args.seeds} vmapped seeds / 1 seed (fused, seed-steps/s): "
        f"{many['seed_steps_per_s'] / fused['seed_steps_per_s']:.2f}x")
  for r in results:
    print(json.dumps(r))


if __name__ == "__main__":
  main()
