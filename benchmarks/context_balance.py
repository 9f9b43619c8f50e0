"""The causal load balance of the context layouts (models/context.py), counted in the blocks that
jax's splash kernel runs: for a row of T tokens split over C devices, each device's
(128-query, 128-key) blocks that the causal mask does not hide entirely, read from the kernel's
own block lists (its forward pass; the backward passes' follow the same mask). The busiest
device sets a pass's time; `max_over_mean` is its blocks over the mean device's (1.0 =
balanced). Counted on the host, no TPU needed; the seconds on a TPU are not measured here.

    python benchmarks/context_balance.py [--tokens 33792] [--context 2 4 8 16]

One JSON line per (context, layout): tokens, context, layout, blocks_per_device,
max_over_mean, seconds (building the kernel's block lists on this host).
"""

import argparse
import json
import time

import numpy as np

from grpo_jax.models.context import row_multiple, splash_kernel


def blocks_per_device(tokens: int, context: int, layout: str) -> list:
  """Each device's non-empty (query block, key block) pairs in the splash kernel's forward
  block mask (heads sharing one mask: one head's)."""
  kernel = splash_kernel(tokens, context, 1, layout)
  block_mask = np.asarray(kernel.fwd_mask_info.block_mask)[0]  # (query blocks, key blocks)
  per_device = np.split(block_mask != 0, context, axis=0)  # query blocks split in C shards
  return [int(part.sum()) for part in per_device]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=1024 + 32768)
  parser.add_argument("--context", type=int, nargs="+", default=[2, 4, 8, 16])
  args = parser.parse_args()
  for context in args.context:
    for layout in ("contiguous", "zigzag"):
      multiple = row_multiple(context, layout, "pallas")
      tokens = -(-args.tokens // multiple) * multiple
      start = time.perf_counter()
      blocks = blocks_per_device(tokens, context, layout)
      print(json.dumps(dict(tokens=tokens, context=context, layout=layout,
                            blocks_per_device=blocks,
                            max_over_mean=round(max(blocks) / float(np.mean(blocks)), 3),
                            seconds=round(time.perf_counter() - start, 1))), flush=True)


if __name__ == "__main__":
  main()
