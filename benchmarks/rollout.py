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
"""

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402


def measure(params, cfg, batch: int, prompt_len: int, new_tokens: int, temperature: float,
            repeats: int, group_size: int = 1, decode_block: int = 0) -> dict:
  import jax
  import numpy as np
  from grpo_jax.rollout.sampler import generate, prefill
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
      decode_block=decode_block))
  t_all = min(common.time_it(run, repeats))
  return dict(prefill=batch * prompt_len / t_fill, decode=batch * new_tokens / (t_all - t_fill),
              total_s=t_all, prefill_s=t_fill)


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
  parser.add_argument("--sampled-only", action="store_true", help="skip the greedy rows")
  args = parser.parse_args()
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
  rows, records = [], []
  policies = (("sampled", 1.0),) if args.sampled_only else (("greedy", 0.0), ("sampled", 1.0))
  for batch in args.batch:
    for name, temperature in policies:
      for block in args.decode_block:
        r = measure(params, cfg, batch, args.prompt_len, args.new_tokens, temperature,
                    args.repeats, args.group_size, block)
        rows.append([batch, args.group_size, block, name, f"{r['prefill']:,.0f}",
                     f"{r['decode']:,.0f}", f"{r['prefill_s']:.3f}", f"{r['total_s']:.3f}"])
        records.append(dict(model=args.checkpoint or args.model, batch=batch,
                            group_size=args.group_size, decode_block=block, decoding=name,
                            prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                            prefill_tokens_per_s=round(r["prefill"], 1),
                            decode_tokens_per_s=round(r["decode"], 1),
                            prefill_s=round(r["prefill_s"], 4), total_s=round(r["total_s"], 4)))
  print(common.table(["batch", "G", "decode block", "decoding", "prefill tok/s",
                      "decode tok/s", "prefill s", "generate s"], rows))
  for record in records:
    print(json.dumps(record))


if __name__ == "__main__":
  main()
