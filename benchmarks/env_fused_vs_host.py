"""RL steps per second of the tiny calculator demo (configs/grpo_calculator_tiny.py) with the
host episodes (train.experience_source="episodes": the sampler jitted per turn, the env and
its tool on the host) against the pure-JAX environment inside the fused iteration
("fused_episodes": every turn, the env, the reward and the RL step in one jitted lax.scan of
--fused_steps steps). Both arms are real `train` runs from the same initial state (the same
seed and supervised warm-up); a step's time is read from its metrics record (step_time_s):
the first host call (compilation) is timed apart, the last one (it evaluates) is not timed.

    python benchmarks/env_fused_vs_host.py [--steps 12] [--fused_steps 4] [--warmup_steps 300]
        [--kv_continuation]   # both arms continue each row's KV cache (env.kv_continuation)

Prints a table, the machine's load average, and one JSON line
{"host_steps_per_s", "jax_steps_per_s", "speedup", ...}.
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
from configs import grpo_calculator_tiny  # noqa: E402


def _config(source: str, steps: int, fused: int, warmup: int, kv: bool = False):
  c = grpo_calculator_tiny.get_config()
  c.env.kv_continuation = kv
  c.warmup.steps = warmup
  c.train.experience_source = source
  c.train.fused_steps = fused
  c.train.steps = steps
  c.train.eval_every = steps
  c.train.eval_size = c.train.eval_batch_size = 8
  c.train.checkpoint_every = 0
  c.train.num_samples = 0
  return c


def _arm(source: str, steps: int, fused: int, warmup: int, kv: bool = False) -> dict:
  """One run's timings: compile_s (the first call), steady steps/s (the median step of the
  calls between the first and the last), and the episodes' mean turns."""
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  with tempfile.TemporaryDirectory() as workdir:
    with contextlib.redirect_stdout(io.StringIO()):  # the run's progress lines
      train(_config(source, steps, fused, warmup, kv), workdir, log=lambda *_: None)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records = [r for r in map(json.loads, f)
                 if "step_time_s" in r and "turns_per_episode" in r]
  per_call = max(fused, 1)
  timed = records[per_call:-per_call]
  step_s = float(np.median([r["step_time_s"] for r in timed]))
  return dict(source=source, compile_s=sum(r["step_time_s"] for r in records[:per_call]),
              steps_per_s=1.0 / step_s, step_ms=1000.0 * step_s, timed_steps=len(timed),
              turns_per_episode=float(np.mean([r["turns_per_episode"] for r in records])),
              reward_mean=float(np.mean([r["reward_mean"] for r in records])))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--fused_steps", type=int, default=4)
  parser.add_argument("--warmup_steps", type=int, default=300)
  parser.add_argument("--kv_continuation", action="store_true",
                      help="env.kv_continuation=True in both arms")
  args = parser.parse_args()
  if args.steps % args.fused_steps or args.steps < 3 * args.fused_steps:
    raise SystemExit(f"--steps={args.steps} must be a multiple of --fused_steps="
                     f"{args.fused_steps}, at least 3 calls (compile, timed, evaluate).")
  host = _arm("episodes", args.steps, 0, args.warmup_steps, args.kv_continuation)
  fused = _arm("fused_episodes", args.steps, args.fused_steps, args.warmup_steps,
               args.kv_continuation)
  print(f"{'source':<16} {'compile s':>10} {'step ms':>9} {'steps/s':>8} {'turns':>6}")
  for r in (host, fused):
    print(f"{r['source']:<16} {r['compile_s']:>10.1f} {r['step_ms']:>9.1f} "
          f"{r['steps_per_s']:>8.2f} {r['turns_per_episode']:>6.2f}")
  print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(json.dumps(dict(host_steps_per_s=host["steps_per_s"],
                        jax_steps_per_s=fused["steps_per_s"],
                        speedup=fused["steps_per_s"] / host["steps_per_s"],
                        host_compile_s=host["compile_s"], jax_compile_s=fused["compile_s"],
                        fused_steps=args.fused_steps, warmup_steps=args.warmup_steps,
                        kv_continuation=args.kv_continuation,
                        turns_per_episode=[host["turns_per_episode"],
                                           fused["turns_per_episode"]],
                        loadavg=list(os.getloadavg()))))


if __name__ == "__main__":
  main()
