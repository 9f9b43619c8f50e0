"""Where the time goes: one call of the sampler or of the update under the JAX profiler, with
the time of each XLA op summed by the JAX operation it came from (the op_name metadata of the
compiled HLO; layer indices folded, so the layers' q_proj are one row).

    python benchmarks/profile_ops.py --what generate --batch 32            # greedy
    python benchmarks/profile_ops.py --what generate --batch 32 --temperature 1
    python benchmarks/profile_ops.py --what update                         # G=8 x 4 prompts
    python benchmarks/profile_ops.py --checkpoint ~/.cache/grpo_jax/models/smollm2-135m-instruct \
        --batch 64 --new-tokens 64     # a real model's folder (fetch_model) instead of --model

Times are summed over threads (two ops running side by side both count), so the column can
add up to more than the wall time printed above it. The trace (Perfetto JSON) stays under
--trace-dir for a closer look (https://ui.perfetto.dev).
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common, grpo_step  # noqa: E402


def op_names(hlo_text: str) -> dict:
  """HLO instruction name -> the JAX op_name it was lowered from."""
  pattern = r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]+)\""
  return {m.group(1): m.group(2) for m in re.finditer(pattern, hlo_text, re.M)}


def profile(fn, trace_dir: str) -> tuple:
  """(wall seconds, [(summed ms, count, XLA op name)]) of one traced call of fn()."""
  import jax
  import shutil
  shutil.rmtree(trace_dir, ignore_errors=True)
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    start = time.perf_counter()
    fn()
    wall = time.perf_counter() - start
  path = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)[0]
  events = json.load(gzip.open(path))["traceEvents"]
  ops = collections.defaultdict(lambda: [0.0, 0])
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name.startswith("$") or "Thunk" in name or "Await" in name:
      continue  # python frames and the executor's own spans
    ops[name][0] += e["dur"] / 1e3
    ops[name][1] += 1
  return wall, [(ms, n, name) for name, (ms, n) in ops.items()]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--what", choices=["generate", "update"], default="generate")
  parser.add_argument("--model", default="qwen2-4L-256", choices=list(common.SHAPES))
  parser.add_argument("--checkpoint", help="generate: a HF folder (overrides --model)")
  parser.add_argument("--batch", type=int, default=32, help="generate: rows")
  parser.add_argument("--prompt-len", type=int, default=32)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--temperature", type=float, default=0.0, help="generate: 0 = greedy")
  parser.add_argument("--group-size", type=int, default=1,
                      help="generate: sampled rows per prompt (batch / G prompts, each "
                           "prefilled once)")
  parser.add_argument("--decode-block", type=int, default=0,
                      help="generate: rollout.decode_block (0: every step reads the whole cache)")
  parser.add_argument("--top", type=int, default=25, help="rows to print")
  parser.add_argument("--trace-dir", default=os.path.join(common.bench_dir(), "trace"))
  args = parser.parse_args()
  malloc = common.ours_setup()
  import jax
  if args.what == "generate":
    from grpo_jax.models.hf import load_hf_checkpoint
    from grpo_jax.rollout.sampler import generate
    cfg, params = load_hf_checkpoint(args.checkpoint or common.checkpoint(args.model))
    tokens, mask = common.random_prompts(args.batch // args.group_size, args.prompt_len)
    kw = dict(model_cfg=cfg, max_new_tokens=args.new_tokens, temperature=args.temperature,
              eos_id=-1, pad_id=common.PAD_ID, group_size=args.group_size,
              decode_block=args.decode_block)
    call = (params, tokens, mask, jax.random.key(0))
    sampler = jax.jit(lambda *a: generate(*a, **kw))  # the one jitted sampler call inside
    hlo = sampler.lower(*call).compile().as_text()
    fn = lambda: jax.block_until_ready(sampler(*call))  # noqa: E731
    what = (f"generate: batch {args.batch} (G {args.group_size}), prompt {args.prompt_len}, "
            f"{args.new_tokens} new tokens, temperature {args.temperature}, decode_block "
            f"{args.decode_block}")
  else:
    run_step, info = grpo_step.build(args.model, 8, 4, args.prompt_len, args.new_tokens)
    run_step()
    state, batch = info["last"]["state"], info["last"]["batch"]
    hlo = info["update"].lower(state, batch).compile().as_text()
    fn = lambda: jax.block_until_ready(info["update"](state, batch))  # noqa: E731
    what = f"update: 32 rows, prompt {args.prompt_len} + {args.new_tokens} completion tokens"
  fn()
  fn()  # compiled and warm
  wall, ops = profile(fn, args.trace_dir)
  names = op_names(hlo)
  by_source = collections.defaultdict(lambda: [0.0, 0])
  for ms, n, name in ops:
    source = re.sub(r"(layers|DecoderLayer)_\d+", r"\1_N", names.get(name, name))
    source = re.sub(r"^jit\([\w]+\)/", "", source)
    by_source[source][0] += ms
    by_source[source][1] += n
  rows = sorted(by_source.items(), key=lambda kv: -kv[1][0])[:args.top]
  total = sum(ms for ms, _, _ in ops)
  print(common.header())
  print(f"{args.checkpoint or args.model}, {what}; {malloc}; traced wall {wall * 1e3:.1f} ms, ops summed "
        f"{total:.1f} ms")
  print(common.table(["ms (summed)", "share", "calls", "from (JAX op_name)"],
                     [[f"{ms:.1f}", f"{ms / total:.1%}", n, src[:110]]
                      for src, (ms, n) in rows]))


if __name__ == "__main__":
  main()
