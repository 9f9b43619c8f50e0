"""Prefill and decode tokens/s of our sampler for a Hugging Face checkpoint.

    python benchmarks/rollout.py --checkpoint /ckpt/qwen2.5-0.5b-instruct --batch 8 32 \
        --prompt-len 128 --new-tokens 256
    python benchmarks/rollout.py --model qwen2-4L-256   # a random checkpoint (common.SHAPES)
    python benchmarks/rollout.py --model qwen2-8L-512 --batch 16 --prompt-len 256 \
        --new-tokens 512 --group-size 8 --decode-block 0 128 --sampled-only

Prompts are random token ids (full length, no padding); --batch rows are batch / G prompts x
G samples (--group-size G, each prompt prefilled once); generation runs exactly --new-tokens
steps (the eos id is one that never occurs). prefill tok/s = batch x prompt tokens / time of
the jitted prefill alone (the sampler's own function, prompts once + the cache repeated G
times); decode tok/s = batch x new tokens / (time of the whole generate call - prefill time).
--decode-block: the decode segment lengths to compare (0 = every step reads all P + N cache
slots). Greedy and sampled (temperature 1, full vocabulary) rows; best of --repeats after a
compiling call. One JSON line per measurement after the table.

    python benchmarks/rollout.py --length-mix --model qwen2-8L-512 --rows 64

--length-mix: static vs slot-refill (rollout.decode_slots) on GSM8K-like completion lengths.
Row r stops after a pre-drawn length L_r (its per-row limit; the eos id never occurs), L_r
~ lognormal with mean --mean-len (sigma --length-sigma), capped at --new-tokens, so both
engines do the same useful work sum(L_r). rows = rows / G prompts x G samples, sampled at
temperature 1. tokens/s = sum(L_r) / time of the whole sampler call (prefill included);
utilisation = sum(L_r) / slot-steps (slots x decode-loop iterations). Ends with one JSON line:
static_tokens_per_s, refill_tokens_per_s, static_utilisation, refill_utilisation, speedup.
"""

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402


def measure(params, cfg, batch: int, prompt_len: int, new_tokens: int, temperature: float,
            repeats: int, group_size: int = 1, decode_block: int = 0,
            decode_loop: str = "segments") -> dict:
  import jax
  import numpy as np
  from grpo_jax.rollout.prefill import prefill
  from grpo_jax.rollout.sampler import generate
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, cfg.vocab_size, size=(batch // group_size, prompt_len),
                        dtype=np.int32)
  mask = np.ones_like(tokens, bool)
  fill = jax.jit(functools.partial(prefill, model_cfg=cfg, max_new_tokens=new_tokens,
                                   group_size=group_size))
  t_fill = min(common.time_it(lambda: jax.block_until_ready(fill(params, tokens, mask)), repeats))
  run = lambda: jax.block_until_ready(generate(  # noqa: E731
      params, tokens, mask, jax.random.key(0), model_cfg=cfg, max_new_tokens=new_tokens,
      temperature=temperature, eos_id=-1, pad_id=0, group_size=group_size,
      decode_block=decode_block, decode_loop=decode_loop))
  t_all = min(common.time_it(run, repeats))
  return dict(prefill=batch * prompt_len / t_fill, decode=batch * new_tokens / (t_all - t_fill),
              total_s=t_all, prefill_s=t_fill)


def draw_lengths(rows: int, mean: float, sigma: float, cap: int, seed: int = 0):
  """GSM8K-like completion lengths: lognormal with mean `mean` (mu = ln(mean) - sigma^2 / 2),
  rounded, clipped to [1, cap]."""
  import numpy as np
  rng = np.random.default_rng(seed)
  mu = np.log(mean) - sigma ** 2 / 2
  return np.clip(np.rint(rng.lognormal(mu, sigma, size=rows)), 1, cap).astype(np.int32)


def length_mix(params, cfg, args) -> dict:
  """Static vs slot-refill tokens/s and utilisation on pre-drawn lengths (module docstring)."""
  import jax
  import numpy as np
  from grpo_jax.rollout.sampler import sample
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, cfg.vocab_size, size=(args.rows // args.group_size, args.prompt_len),
                        dtype=np.int32)
  mask = np.ones_like(tokens, bool)
  lengths = draw_lengths(args.rows, args.mean_len, args.length_sigma, args.new_tokens)
  useful = int(lengths.sum())
  settings = dict(model_cfg=cfg, max_new_tokens=args.new_tokens, temperature=1.0, eos_id=-1,
                  pad_id=0, group_size=args.group_size, decode_block=args.decode_block[0])
  out = dict(model=args.checkpoint or args.model, rows=args.rows, group_size=args.group_size,
             prompt_len=args.prompt_len, new_tokens=args.new_tokens,
             mean_len=round(float(lengths.mean()), 1), max_len=int(lengths.max()),
             useful_tokens=useful, decode_block=args.decode_block[0])
  results = {}
  for name, slots in [("static", 0)] + [(f"refill_{s}", s) for s in args.decode_slots]:
    call = lambda slots=slots: jax.block_until_ready(sample(  # noqa: E731
        params, tokens, mask, jax.random.key(0), lengths, decode_slots=slots, **settings))
    rollout, stats = call()
    got = np.asarray(rollout.completion_mask).sum(1)
    assert np.array_equal(got, lengths), "every row must stop at its drawn length"
    seconds = min(common.time_it(call, args.repeats, warmup=0))
    results[name] = dict(slots=slots or args.rows, seconds=seconds,
                         tokens_per_s=useful / seconds,
                         utilisation=useful / int(np.asarray(stats.slot_steps)))
  best = max((k for k in results if k != "static"), key=lambda k: results[k]["tokens_per_s"])
  static, refill = results["static"], results[best]
  print(common.table(["engine", "slots", "seconds", "useful tok/s", "utilisation"],
                     [[k, r["slots"], f"{r['seconds']:.2f}", f"{r['tokens_per_s']:,.0f}",
                       f"{r['utilisation']:.3f}"] for k, r in results.items()]))
  out.update({f"{k}_tokens_per_s": round(r["tokens_per_s"], 1) for k, r in results.items()
              if k != "static"})
  out.update(decode_slots=refill["slots"],
             static_tokens_per_s=round(static["tokens_per_s"], 1),
             refill_tokens_per_s=round(refill["tokens_per_s"], 1),
             static_utilisation=round(static["utilisation"], 4),
             refill_utilisation=round(refill["utilisation"], 4),
             speedup=round(refill["tokens_per_s"] / static["tokens_per_s"], 3))
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--checkpoint", help="a Hugging Face checkpoint directory")
  parser.add_argument("--model", default="qwen2-4L-256", help="else a random one: " +
                      ", ".join(common.SHAPES))
  parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
  parser.add_argument("--prompt-len", type=int, default=32)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dtype", default="float32", help="param and compute dtype")
  parser.add_argument("--group-size", type=int, default=1, help="samples per prompt")
  parser.add_argument("--decode-block", type=int, nargs="+", default=[0],
                      help="decode segment lengths to compare (0 = read every cache slot)")
  parser.add_argument("--decode-loop", nargs="+", default=["segments"],
                      help="the static engine's decode loops to compare: segments | bounded "
                      "(rollout.decode_loop)")
  parser.add_argument("--sampled-only", action="store_true", help="skip the greedy rows")
  parser.add_argument("--length-mix", action="store_true",
                      help="static vs slot refill on GSM8K-like lengths (see the docstring)")
  parser.add_argument("--rows", type=int, default=64, help="--length-mix: rollout rows")
  parser.add_argument("--decode-slots", type=int, nargs="+", default=None,
                      help="--length-mix: slot counts to try (default rows/2 and rows/4); the "
                      "fastest is reported as refill")
  parser.add_argument("--mean-len", type=float, default=220.0)
  parser.add_argument("--length-sigma", type=float, default=0.6)
  args = parser.parse_args()
  if args.length_mix:
    if args.new_tokens == 64:  # the default: the length mix's cap is 512
      args.new_tokens = 512
    if args.group_size == 1:
      args.group_size = 8
    if args.decode_block == [0]:
      args.decode_block = [128]  # rollout.decode_block's default, for the static engine
    # rows: one slot per row (no row waits; the slots compacted as rows end), then fewer
    args.decode_slots = args.decode_slots or [args.rows, args.rows // 2, args.rows // 4]
    args.batch = [args.rows]
  for b in args.batch:
    if b % args.group_size:
      parser.error(f"--batch {b} is not a multiple of --group-size {args.group_size}")
  malloc = common.ours_setup()
  import jax
  from grpo_jax.models.hf import load_hf_checkpoint
  path = args.checkpoint or common.checkpoint(args.model)
  cfg, params = load_hf_checkpoint(path, args.dtype, args.dtype)
  print(common.header())
  n = sum(x.size for x in jax.tree.leaves(params))
  print(f"checkpoint {path}: {n / 1e6:.1f}M params, {args.dtype}; prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens; best of {args.repeats}; {malloc}")
  if args.length_mix:
    print(json.dumps(length_mix(params, cfg, args)))
    return
  rows, records = [], []
  policies = (("sampled", 1.0),) if args.sampled_only else (("greedy", 0.0), ("sampled", 1.0))
  for batch in args.batch:
    for name, temperature in policies:
      for block, loop in [(b, lp) for b in args.decode_block for lp in args.decode_loop]:
        r = measure(params, cfg, batch, args.prompt_len, args.new_tokens, temperature,
                    args.repeats, args.group_size, block, loop)
        rows.append([batch, args.group_size, f"{block} {loop}", name, f"{r['prefill']:,.0f}",
                     f"{r['decode']:,.0f}", f"{r['prefill_s']:.3f}", f"{r['total_s']:.3f}"])
        records.append(dict(model=args.checkpoint or args.model, batch=batch,
                            group_size=args.group_size, decode_block=block,
                            decode_loop=loop, decoding=name,
                            prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                            prefill_tokens_per_s=round(r["prefill"], 1),
                            decode_tokens_per_s=round(r["decode"], 1),
                            prefill_s=round(r["prefill_s"], 4), total_s=round(r["total_s"], 4)))
  print(common.table(["batch", "G", "decode block, loop", "decoding", "prefill tok/s",
                      "decode tok/s", "prefill s", "generate s"], rows))
  for record in records:
    print(json.dumps(record))


if __name__ == "__main__":
  main()
