"""The accelerator check: is the GPU (or TPU) path sound and fast, in one short run.

    python benchmarks/accelerator_check.py --out DIR     # one H100/H200: <= 8 minutes
    python benchmarks/accelerator_check.py --tiny        # the same parts, tiny shapes, CPU

Each part runs in its own process under its own time limit (--limit PART=SECONDS), so a part
that hangs or compiles for minutes is stopped and reported while the others still run. The
parts run twice: with JAX's persistent compilation cache cold (an empty folder), then warm
(the same folder). Every result is one JSON line on stdout (and in DIR/accelerator_check.jsonl
with --out), with "part" and "phase" keys.

  env      jax / jaxlib / CUDA plugin versions, backend, device kind and count, XLA_FLAGS, the
           platform table's choices (grpo_jax/parallel/choices.py); a square bf16 matmul's
           TFLOP/s (the MFU peak: measured, not the spec sheet) and an elementwise pass's bytes
           read + written per second (the decode bound's memory rate).
  sampler  the product's sampler (grpo_jax.rollout.sampler, rollout.decode_loop "auto" and
           the other loop at the middle batch) at the Qwen2.5-0.5B shape, random weights,
           float32 master params, bfloat16 compute, prompt 256, 256 new tokens, sampled at
           temperature 1, G = 8, rows 64 / 256 / 1024: trace, lower and compile seconds, the
           first call and the steady call, the prefill alone, decode tokens/s =
           rows x new / (steady call - prefill), and its fraction of the memory bound
           rows / ((bf16 weight bytes + mean KV-cache bytes read per step) / memory rate).
  update   the RL step (grpo_jax.train.learner.step.make_rl_step, the state donated) at that shape:
           256 rows x (256 + 256), K = 8 micro-batches, shared-prompt forward, remat full,
           logits chunk 64; trace / lower / compile / three calls; tokens/s and MFU; with
           the platform's attention, then with the alternative (cuDNN's on a GPU).
  gsm8k    `python -m grpo_jax.main --config=configs/grpo_gsm8k.py` on a random checkpoint of
           the 0.5B shape (its settings but 32 prompts a step instead of 128, to fit the
           check's minutes; steps 2, a 64-prompt held-out set): the first and
           the steady step, the rollout / update split, and every jitted function's trace /
           lower / compile seconds and program count (JAX's compile log).

MFU's FLOP formula (model FLOPs of one RL step; remat's recomputation not counted):
  F_fwd = 2 x N_layers x T + 2 x V x H x R x N_new + 4 x L x H_q x D x pairs
  model FLOPs = 4 x F_fwd   (the policy's forward and backward, 3 F_fwd; the reference's, F_fwd)
with N_layers the layers' matmul params, T the tokens a pass runs (the prompts once per group
with the shared-prompt forward, plus every completion token), V x H the vocabulary projection
(completion positions only), pairs the causal (query, key) pairs. MFU = model FLOPs / seconds /
the env part's measured matmul TFLOP/s.

--tiny: a 2-layer model, a few rows, on the CPU (tests/test_accelerator_check.py runs it).
This file is the harness (limits, child processes, the JSON lines); the parts' code is in
benchmarks/accelerator_parts.py.
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
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks.accelerator_parts import (part_env, part_gsm8k, part_sampler,  # noqa: E402
                                         part_update)

PARTS = ("env", "sampler", "update", "gsm8k")
# Seconds per part and phase on one GPU: 8 minutes in all, the cold phase first.
LIMITS = {("env", "cold"): 30, ("sampler", "cold"): 130, ("update", "cold"): 100,
          ("gsm8k", "cold"): 130, ("env", "warm"): 0, ("sampler", "warm"): 40,
          ("update", "warm"): 0, ("gsm8k", "warm"): 60}
# --tiny: limits that a loaded 2-core CI machine never reaches (the mechanism is the same).
TINY_LIMITS = {key: (600 if value else 0) for key, value in LIMITS.items()}
REAL = dict(shape="qwen2.5-0.5b", prompt=256, new=256, group=8, batches=(64, 256, 1024),
            update_rows=256, micro_batches=8, matmul=8192, copy_mib=1024, gsm8k_prompts=32)
TINY = dict(shape="qwen2-tiny", prompt=16, new=16, group=2, batches=(4, 8), update_rows=8,
            micro_batches=2, matmul=256, copy_mib=16)


# ----------------------------------------------------------------------------- the harness


def run_part(part: str, phase: str, args, env: dict, limit: float, context: dict) -> list:
  """One part in a child process under `limit` seconds; its CHECK lines, or a timeout line."""
  command = [sys.executable, os.path.abspath(__file__), "--part", part, "--workdir",
             args.workdir, "--context", json.dumps(context), "--limit-s", str(limit)]
  if args.tiny:
    command.append("--tiny")
  start = time.perf_counter()
  try:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=limit)
    out, err, status = done.stdout, done.stderr, ("ok" if done.returncode == 0 else
                                                  f"exit {done.returncode}")
  except subprocess.TimeoutExpired as e:
    decode = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa
    out, err, status = decode(e.stdout), decode(e.stderr), f"stopped at its {limit:g} s limit"
  seconds = time.perf_counter() - start
  records = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("CHECK ")]
  for r in records:
    r["phase"] = phase
  records.append(dict(part=part, phase=phase, status=status, wall_s=round(seconds, 1),
                      **({} if status == "ok" else {"stderr_tail": err[-1200:]})))
  return records


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tiny", action="store_true", help="tiny shapes on this machine")
  parser.add_argument("--out", help="also write the JSON lines to OUT/accelerator_check.jsonl")
  parser.add_argument("--parts", default=",".join(PARTS))
  parser.add_argument("--limit", action="append", default=[], metavar="PART[:PHASE]=S",
                      help="a part's time limit in seconds (0 skips it)")
  parser.add_argument("--xla-flags", default="", help="appended to XLA_FLAGS for every part "
                      "(e.g. --xla_gpu_autotune_level=0 for a second run)")
  parser.add_argument("--part", help=argparse.SUPPRESS)  # a child: run this one part
  parser.add_argument("--workdir", default="", help=argparse.SUPPRESS)
  parser.add_argument("--context", default="{}", help=argparse.SUPPRESS)
  parser.add_argument("--limit-s", type=float, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args()
  sizes = TINY if args.tiny else REAL
  if args.part:
    context = json.loads(args.context)
    if args.part == "env":
      part_env(sizes, args.tiny)
    elif args.part == "sampler":
      part_sampler(sizes, args.tiny, context.get("memory_gbps") or 0.0)
    elif args.part == "update":
      part_update(sizes, args.tiny, context.get("matmul_tflops") or 0.0)
    else:
      part_gsm8k(sizes, args.tiny, args.limit_s, args.workdir)
    return
  limits = dict(TINY_LIMITS if args.tiny else LIMITS)
  for item in args.limit:
    key, _, value = item.partition("=")
    part, _, phase = key.partition(":")
    for ph in ([phase] if phase else ["cold", "warm"]):
      limits[(part, ph)] = float(value)
  parts = [p.strip() for p in args.parts.split(",") if p.strip()]
  out_file = None
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    out_file = open(os.path.join(args.out, "accelerator_check.jsonl"), "w")  # noqa: SIM115
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="accelerator_check-") as workdir:
    args.workdir = workdir
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(workdir, "xla_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
               XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONPATH=ROOT)
    if args.tiny:
      env["JAX_PLATFORMS"] = "cpu"
    if args.xla_flags:
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
    context = {}
    for phase in ("cold", "warm"):
      for part in parts:
        limit = limits.get((part, phase), 0)
        if not limit:
          continue
        for record in run_part(part, phase, args, env, limit, context):
          if record.get("part") == "env" and "matmul_tflops" in record:
            context.update(matmul_tflops=record["matmul_tflops"],
                           memory_gbps=record["memory_gbps"])
          line = json.dumps(record)
          print(line, flush=True)
          if out_file:
            out_file.write(line + "\n")
            out_file.flush()
  summary = dict(part="summary", tiny=args.tiny, wall_s=round(time.perf_counter() - start, 1))
  print(json.dumps(summary))
  if out_file:
    out_file.write(json.dumps(summary) + "\n")
    out_file.close()


if __name__ == "__main__":
  main()
