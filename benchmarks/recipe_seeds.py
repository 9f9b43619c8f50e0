"""A recipe over seeds: per seed the held-out peak, the final figure and the largest fall after
the peak, then the mean and spread (issue 76).

    python benchmarks/recipe_seeds.py --config=configs/grpo_calculator_tiny.py \
        --workdir=/tmp/calc_seeds --seeds 0 1 2 [--parallel 2] [-- --config.x=y ...]
    python benchmarks/recipe_seeds.py --config=configs/grpo_tiny.py --workdir=/tmp/tiny_seeds \
        --vmap                      # the seeds as one program (--vmap_seeds), where it applies
    python benchmarks/recipe_seeds.py --workdir=/tmp/calc_seeds --seeds 0 1 2 --report_only

Each seed runs `python -m grpo_jax.main` in WORKDIR/seed_<s> (a finished run is only read
back). Prints a markdown table and one JSON line per seed with the keys recipe, seed, peak,
peak_step, final, fall_after_peak, no_signal_steps, wall_s; then one with the summary
(final_mean, final_std, final_min, final_max, worst_fall, seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import cpu_name  # noqa: E402


def seed_figures(records: list[dict], metric: str = "eval_accuracy") -> dict:
  """peak (the first step that reaches it), final, the largest fall below the peak at or
  after it, and the steps whose every group was tied."""
  curve = [(r["step"], r[metric]) for r in records if metric in r]
  if not curve:
    raise SystemExit(f"no {metric} in the records; did the run finish?")
  peak_step, peak = max(curve, key=lambda p: (p[1], -p[0]))
  after = [v for s, v in curve if s >= peak_step]
  tied = sum(r.get("frac_groups_all_same", 0.0) >= 1.0 for r in records
             if "frac_groups_all_same" in r)
  return dict(peak=peak, peak_step=peak_step, final=curve[-1][1],
              fall_after_peak=peak - min(after), no_signal_steps=tied,
              curve=[round(v, 3) for _, v in curve])


def _read(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _run(cmd: list[str], log_path: str) -> float:
  start = time.perf_counter()
  with open(log_path, "w") as log:
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/grpo_calculator_tiny.py")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--parallel", type=int, default=1, help="seeds run at once (processes)")
  parser.add_argument("--vmap", action="store_true", help="the seeds as one program")
  parser.add_argument("--report_only", action="store_true")
  parser.add_argument("--metric", default="eval_accuracy")
  parser.add_argument("overrides", nargs="*", help="--config.x=y flags, after --")
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  base = [sys.executable, "-m", "grpo_jax.main", f"--config={args.config}", *args.overrides]
  walls = {}
  if not args.report_only:
    if args.vmap:
      seeds = ",".join(map(str, args.seeds))
      wall = _run(base + [f"--workdir={args.workdir}", f"--vmap_seeds={seeds}"],
                  os.path.join(args.workdir, "run.log"))
      walls = {s: wall for s in args.seeds}
    else:
      def one(s):
        return s, _run(base + [f"--workdir={args.workdir}/seed_{s}", f"--config.seed={s}"],
                       os.path.join(args.workdir, f"seed_{s}.log"))
      with ThreadPoolExecutor(args.parallel) as pool:
        walls = dict(pool.map(one, args.seeds))
  rows = []
  for s in args.seeds:
    fig = seed_figures(_read(os.path.join(args.workdir, f"seed_{s}")), args.metric)
    rows.append(dict(recipe=args.config, seed=s, **fig, wall_s=round(walls.get(s, 0.0), 1)))
  finals = [r["final"] for r in rows]
  mean = sum(finals) / len(finals)
  std = (sum((f - mean) ** 2 for f in finals) / max(len(finals) - 1, 1)) ** 0.5
  print(f"{args.config} {' '.join(args.overrides)}; seeds {args.seeds}; {cpu_name()}; "
        f"{time.strftime('%Y-%m-%d')}")
  print(f"| seed | {args.metric} at each evaluation | peak (step) | final | largest fall "
        f"after the peak | steps without signal | wall s |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['seed']} | {' / '.join(f'{v:.3f}' for v in r['curve'])} | {r['peak']:.3f} "
          f"({r['peak_step']}) | {r['final']:.3f} | {r['fall_after_peak']:.3f} | "
          f"{r['no_signal_steps']} | {r['wall_s']:.0f} |")
  print(f"final: {mean:.3f} ± {std:.3f} (mean ± sample std), min {min(finals):.3f}, max "
        f"{max(finals):.3f}; worst fall after a peak {max(r['fall_after_peak'] for r in rows):.3f}")
  for r in rows:
    print(json.dumps({k: v for k, v in r.items() if k != "curve"}))
  print(json.dumps(dict(recipe=args.config, final_mean=round(mean, 4), final_std=round(std, 4),
                        final_min=min(finals), final_max=max(finals),
                        worst_fall=max(r["fall_after_peak"] for r in rows),
                        seeds=args.seeds)))


if __name__ == "__main__":
  main()
