"""Where a run's first step goes: every XLA compilation of `python -m grpo_jax.main`, timed.

Runs the trainer in a child process with JAX_LOG_COMPILES=1, reads JAX's own log lines
("Finished tracing ...", "Finished jaxpr to MLIR module conversion ...", "Finished XLA
compilation of jit(NAME) in S sec"), and prints, per jitted function, how often it was compiled
and the seconds spent tracing, lowering and compiling it; then steps 1 and 2 of metrics.jsonl
(rollout / reward / update seconds), so the first step's excess over the second can be set
against the compile seconds.

    python benchmarks/compile_times.py --config=configs/grpo_smollm2.py --steps 2 \
        --set train.eval_size=8 --set train.eval_batch_size=8
    python benchmarks/compile_times.py ... --cache-dir /tmp/jax_cache   # run twice: warm start
    python benchmarks/compile_times.py ... --xla-flags=--xla_gpu_autotune_level=0

One JSON line ends the output (keys: compile_s, lower_s, trace_s, compiles, step1_s, step2_s,
wall_s, top).
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"Finished (tracing|jaxpr to MLIR module conversion|XLA compilation)"
                  r"(?: of)? (.+?)(?: for jit)? in ([0-9.e-]+) sec")
PHASE = {"tracing": "trace_s", "jaxpr to MLIR module conversion": "lower_s",
         "XLA compilation": "compile_s"}


def parse(log: str) -> dict:
  """{function name: {"trace_s", "lower_s", "compile_s", "compiles"}} from JAX's log lines."""
  table = collections.defaultdict(lambda: dict(trace_s=0.0, lower_s=0.0, compile_s=0.0,
                                               compiles=0))
  for m in LINE.finditer(log):
    phase, name, secs = m.group(1), m.group(2).strip(), float(m.group(3))
    name = re.sub(r"^jit\((.*)\)$", r"\1", name)
    table[name][PHASE[phase]] += secs
    table[name]["compiles"] += phase == "XLA compilation"
  return dict(table)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/grpo_smollm2.py")
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config override (repeatable)")
  parser.add_argument("--cache-dir", help="JAX's persistent compilation cache")
  parser.add_argument("--xla-flags", default="", help="appended to XLA_FLAGS")
  parser.add_argument("--top", type=int, default=12)
  parser.add_argument("--log", help="keep the child's log here")
  args = parser.parse_args()

  env = dict(os.environ, JAX_LOG_COMPILES="1")
  if args.xla_flags:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
  if args.cache_dir:
    env.update(JAX_COMPILATION_CACHE_DIR=args.cache_dir,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
  with tempfile.TemporaryDirectory() as workdir:
    command = [sys.executable, "-m", "grpo_jax.main", f"--config={args.config}",
               f"--workdir={workdir}", f"--config.train.steps={args.steps}",
               *[f"--config.{kv}" for kv in args.set]]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    log = done.stdout + done.stderr
    if args.log:
      with open(args.log, "w") as f:
        f.write(log)
    if done.returncode:
      sys.exit(f"the run failed ({done.returncode}); its last lines:\n{log[-3000:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records = {r["step"]: r for r in map(json.loads, f) if "time_update_s" in r}

  table = parse(log)
  ranked = sorted(table.items(), key=lambda kv: -(kv[1]["compile_s"] + kv[1]["lower_s"]))
  print(f"{'function':40s} {'compiles':>8s} {'trace s':>8s} {'lower s':>8s} {'compile s':>9s}")
  for name, t in ranked[:args.top]:
    print(f"{name[:40]:40s} {t['compiles']:8d} {t['trace_s']:8.2f} {t['lower_s']:8.2f} "
          f"{t['compile_s']:9.2f}")
  totals = {k: round(sum(t[k] for t in table.values()), 2)
            for k in ("trace_s", "lower_s", "compile_s", "compiles")}
  steps = {}
  for s in (1, 2):
    r = records.get(s, {})
    steps[f"step{s}_s"] = {k: round(r[f"time_{k}_s"], 3) for k in ("rollout", "reward", "update")
                           if f"time_{k}_s" in r}
    print(f"step {s}: " + ", ".join(f"{k} {v:.2f} s" for k, v in steps[f"step{s}_s"].items()))
  print(f"all functions: {totals['compiles']} compilations, tracing {totals['trace_s']:.1f} s, "
        f"lowering {totals['lower_s']:.1f} s, compiling {totals['compile_s']:.1f} s; "
        f"process wall {wall:.1f} s")
  top = {name: round(t["compile_s"] + t["lower_s"], 2) for name, t in ranked[:5]}
  print(json.dumps(dict(**totals, **steps, wall_s=round(wall, 1), top=top)))


if __name__ == "__main__":
  main()
