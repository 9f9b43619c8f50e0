"""How our GRPO step time grows with group size, completion length and model size.

One axis varies at a time around the base (qwen2-4L-256, G=8, 4 prompts, 32 prompt tokens,
64 completion tokens); the step is benchmarks/grpo_step.py (rollout, rewards, reference
log-probs, update; the old log-probs are the update's own at mu = 1). Median of --steps steps
after a compiling one.

    python benchmarks/scaling.py
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common, grpo_step  # noqa: E402

BASE = dict(model="qwen2-4L-256", group_size=8, num_prompts=4, prompt_len=32, new_tokens=64)
AXES = {"group_size": [4, 8, 16], "new_tokens": [32, 64, 128],
        "model": ["qwen2-4L-256", "qwen2-8L-512", "qwen2-12L-768"]}


def measure(steps: int, **kw) -> dict:
  run_step, _ = grpo_step.build(**kw)
  run_step()
  totals, parts = [], []
  for _ in range(steps):
    start = time.perf_counter()
    parts.append(dict(run_step()))
    totals.append(time.perf_counter() - start)
  out = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
  out["step"] = statistics.median(totals)
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--axes", nargs="+", default=list(AXES), choices=list(AXES))
  args = parser.parse_args()
  malloc = common.ours_setup()
  print(common.header())
  print(f"base: {BASE}; median of {args.steps} steps after the first; {malloc}")
  rows, seen = [], {}
  for axis in args.axes:
    for value in AXES[axis]:
      kw = dict(BASE, **{axis: value})
      key = tuple(sorted(kw.items()))
      if key not in seen:
        seen[key] = measure(args.steps, **kw)
      r = seen[key]
      tokens = kw["group_size"] * kw["num_prompts"] * (kw["prompt_len"] + kw["new_tokens"])
      rows.append([axis, value, f"{common.num_params(kw['model']) / 1e6:.1f}M",
                   kw["group_size"] * kw["num_prompts"], tokens, f"{r['step']:.2f}",
                   f"{r['rollout']:.2f} / {r['prepare']:.2f} / {r['update']:.2f}",
                   f"{tokens / r['step']:,.0f}"])
  print(common.table(["varied", "value", "params", "completions", "tokens", "step s",
                      "rollout / prepare / update s", "tokens/s"], rows))


if __name__ == "__main__":
  main()
