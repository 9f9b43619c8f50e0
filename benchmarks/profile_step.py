"""Where a real recipe's step goes: runs `python -m grpo_jax.main` with the flags after `--` in
this process, traces step --step (its rollout, scoring and RL step) under the JAX profiler,
and prints the seconds of each jitted program the step ran, then the RL step's ops summed by
pass (the no-gradient forwards such as the reference, the forward, the rematerialised forward,
the backward, the rest) and by part of the model (MLP, q/k/v/o projections, attention,
vocabulary, norms).

    python benchmarks/profile_step.py --step 3 -- --config=configs/grpo_gsm8k.py \\
        --workdir=/tmp/profile --config.train.steps=3 ...

How: the source the run uses ("host" or "fused") is wrapped through its registry
(`register_experience_source(..., replace=True)`), so its step --step runs inside
`jax.profiler.trace`; XLA dumps the RL step's optimised HLO (XLA_FLAGS --xla_dump_to, set here
before JAX starts), whose op_name metadata names the JAX operation each traced op came from.
Op times are summed over threads, so they can add up to more than the step's wall time. When a
run compiles the RL step for several shapes (rl.pack_tokens), the dump that holds the traced
ops' names is used. The trace (Perfetto JSON) stays under --out for a closer look.
"""

import argparse
import collections
import glob
import gzip
import importlib
import json
import os
import re
import runpy
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PASSES = (("rematerialised forward", r"rematted_computation"), ("backward", r"transpose\(jvp"),
          ("forward", r"jvp\("),
          ("no-gradient forwards (reference, old log-probs)", r"^Decoder/|checkpoint"),
          ("the rest (advantages, optimizer, ...)", r""))
PARTS = (("MLP", r"/mlp/"), ("q/k/v/o projections", r"/self_attn/[qkvo]_proj/"),
         ("attention", r"/self_attn/"), ("norms", r"layernorm|/norm"),
         ("other layer ops", r"/layers/|DecoderLayer"), ("vocabulary and loss", r""))


def traced(make, step: int, out: str):
  """A learner factory (learner.make_advance) whose advance traces its `step`-th call into out/trace."""
  def wrapped(run, state, *args, **kwargs):
    advance, calls = make(run, state, *args, **kwargs), [0]

    def advance_traced(state):
      import jax
      calls[0] += 1
      if calls[0] != step:
        return advance(state)
      with jax.profiler.trace(os.path.join(out, "trace"), create_perfetto_trace=True):
        started = time.perf_counter()
        result = jax.block_until_ready(advance(state))
        print(f"profile_step: traced step {step}: {time.perf_counter() - started:.1f} s")
      return result
    return advance_traced
  return wrapped


def op_sources(dump: str, module: str, ops: set) -> dict:
  """HLO instruction name -> JAX op_name, from the dumped module named `module` whose
  instruction names hold the most of `ops` (the traced ones)."""
  from benchmarks.profile_ops import op_names  # noqa: PLC0415
  best, best_hits = {}, -1
  for path in sorted(glob.glob(os.path.join(dump, f"*.{module}.*after_optimizations.txt"))):
    with open(path) as f:
      names = op_names(f.read())
    hits = len(ops & names.keys())
    if hits > best_hits:
      best, best_hits = names, hits
  return best


def summarise(out: str) -> None:
  path = glob.glob(os.path.join(out, "trace", "**", "*.trace.json.gz"), recursive=True)[0]
  with gzip.open(path) as f:
    events = [e for e in json.load(f)["traceEvents"]
              if e.get("ph") == "X" and "hlo_module" in e.get("args", {})]
  by_module = collections.defaultdict(float)
  for e in events:
    by_module[e["args"]["hlo_module"]] += e["dur"] / 1e6
  print("ops summed by jitted program (s):")
  for module, seconds in sorted(by_module.items(), key=lambda kv: -kv[1]):
    print(f"  {seconds:8.2f}  {module}")
  step_ops = [e for e in events if e["args"]["hlo_module"] == "jit_rl_step"]
  sources = op_sources(os.path.join(out, "dump"), "jit_rl_step",
                       {e["args"]["hlo_op"] for e in step_ops})
  passes, parts = collections.defaultdict(float), collections.defaultdict(float)
  for e in step_ops:
    source = sources.get(e["args"]["hlo_op"], "")
    passes[next(name for name, key in PASSES if re.search(key, source))] += e["dur"] / 1e6
    parts[next(name for name, key in PARTS if re.search(key, source))] += e["dur"] / 1e6
  for title, table in (("RL step by pass", passes), ("RL step by part", parts)):
    total = sum(table.values())
    print(f"{title} (s, ops summed {total:.1f}):")
    for name, seconds in sorted(table.items(), key=lambda kv: -kv[1]):
      print(f"  {seconds:8.2f}  {seconds / total:6.1%}  {name}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--step", type=int, default=3, help="which step to trace (1 = first)")
  parser.add_argument("--out", default="/tmp/grpo_jax_profile_step",
                      help="trace and HLO dump folder (emptied first)")
  parser.add_argument("main_flags", nargs=argparse.REMAINDER,
                      help="-- then grpo_jax.main's flags")
  args = parser.parse_args()
  flags = [f for f in args.main_flags if f != "--"]
  import shutil
  shutil.rmtree(args.out, ignore_errors=True)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={args.out}/dump"
                             " --xla_dump_hlo_module_re=rl_step").strip()
  loop = importlib.import_module("grpo_jax.train.stages.rl")  # the learner's advance, traced
  loop.make_advance = traced(loop.make_advance, args.step, args.out)
  sys.argv = ["grpo_jax.main"] + flags
  try:
    runpy.run_module("grpo_jax.main", run_name="__main__")
  except SystemExit as stop:
    if stop.code:
      raise
  summarise(args.out)


if __name__ == "__main__":
  main()
