"""The update step alone (PPO-clip + k3 KL forward, backward and one AdamW step): tokens/s,
model FLOP/s (6 * N * tokens / time) and, on a GPU, model FLOPs utilisation.

    python benchmarks/update_step.py --model qwen2-4L-256 qwen2-8L-512
    python benchmarks/update_step.py --model qwen2-12L-768 --dtype bfloat16   # on a GPU

tokens = batch x (prompt + completion) positions, all real (no padding); N = the parameter
count (tied embeddings counted once, as the output projection; attention's own FLOPs are not
counted, as usual for 6N). MFU = model FLOP/s / peak: the peak is --peak-tflops, else looked
up for known GPUs (dense bfloat16, or TF32 for float32 matmuls, XLA's default precision on
NVIDIA GPUs); on a CPU no MFU is printed unless --peak-tflops is given.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common, grpo_step  # noqa: E402

# Dense peak TFLOP/s: (bfloat16, TF32) per device, from the vendors' data sheets.
PEAKS = {"H200": (989.0, 494.0), "H100": (989.0, 494.0), "A100": (312.0, 156.0),
         "L4": (121.0, 60.0)}


def peak_tflops(dtype: str, override: float):
  import jax
  if override:
    return override
  kind = jax.devices()[0].device_kind
  for name, (bf16, tf32) in PEAKS.items():
    if name in kind:
      return bf16 if dtype == "bfloat16" else tf32
  return None


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model", nargs="+", default=["qwen2-4L-256", "qwen2-8L-512"])
  parser.add_argument("--group-size", type=int, default=8)
  parser.add_argument("--num-prompts", type=int, default=4)
  parser.add_argument("--prompt-len", type=int, default=32)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--peak-tflops", type=float, default=0.0)
  args = parser.parse_args()
  malloc = common.ours_setup()
  import jax
  print(common.header())
  peak = peak_tflops(args.dtype, args.peak_tflops)
  rows = []
  for model in args.model:
    run_step, info = grpo_step.build(model, args.group_size, args.num_prompts, args.prompt_len,
                                     args.new_tokens, dtype=args.dtype)
    run_step()
    state, batch = info["last"]["state"], info["last"]["batch"]
    update = info["update"]
    seconds = min(common.time_it(lambda: jax.block_until_ready(update(state, batch)),
                                 args.repeats))
    tokens = args.group_size * args.num_prompts * (args.prompt_len + args.new_tokens)
    flops = 6 * info["params"] * tokens / seconds
    mfu = f"{flops / (peak * 1e12):.1%}" if peak else "n/a (CPU)"
    rows.append([model, f"{info['params'] / 1e6:.1f}M", tokens, f"{seconds:.3f}",
                 f"{tokens / seconds:,.0f}", f"{flops / 1e9:,.1f}", mfu])
  print(f"{jax.devices()[0].device_kind}, {args.dtype}; G={args.group_size} x "
        f"{args.num_prompts} prompts, prompt {args.prompt_len} + {args.new_tokens} completion "
        f"tokens; best of {args.repeats}; peak {peak or '-'} TFLOP/s; {malloc}")
  print(common.table(["model", "params N", "tokens", "update s", "tokens/s",
                      "6N tokens/s (GFLOP/s)", "MFU"], rows))


if __name__ == "__main__":
  main()
