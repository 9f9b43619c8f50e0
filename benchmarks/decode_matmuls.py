"""Where the sampler's limit is at large batch: the matrix multiplies of one decode step alone,
in XLA (what our sampler compiles to) and in torch (what transformers' generate runs on), at
the same shapes.

One decode step of a Llama-family model at batch B multiplies (B, hidden) activations by every
projection of every layer (q, k, v, o; gate, up, down) and by the vocabulary (the tied
embedding). This script times those matmuls alone, float32: each shape's matmuls as one jitted
scan over stacked weights (XLA, no dispatch per matmul) and as torch.matmul calls (the same
threads), best of --repeats, and reports per batch:
  * GFLOP/s of each library on the step's matmuls (2 * B * in * out per matmul),
  * the matmul-only decode rate, tokens/s = B / (sum over the step's matmuls of their time),
  * the ratio XLA / torch.
A sampler cannot beat its matmuls: where the ratio is near the measured ours / generate ratio
(benchmarks/vs_hf_generate.py), the difference is the libraries' matmul kernels, not the loop.

    python benchmarks/decode_matmuls.py --model-path ~/.cache/grpo_jax/models/smollm2-135m-instruct
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402


def step_shapes(cfg: dict) -> list:
  """(in, out, count) of the matmuls of one decode step."""
  hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
  head = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
  q, kv = cfg["num_attention_heads"] * head, cfg["num_key_value_heads"] * head
  return [(hidden, q, layers), (hidden, kv, 2 * layers), (q, hidden, layers),
          (hidden, inter, 2 * layers), (inter, hidden, layers), (hidden, cfg["vocab_size"], 1)]


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--model-path", required=True, help="a HF folder (its config.json)")
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--torch-threads", type=int, default=os.cpu_count())
  args = parser.parse_args()
  with open(os.path.join(args.model_path, "config.json")) as f:
    cfg = json.load(f)
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  torch.set_num_threads(args.torch_threads)
  print(common.header())
  rng = np.random.default_rng(0)
  rows, out = [], []
  for batch in args.batches:
    xla_s = torch_s = flops = 0.0
    for n_in, n_out, count in step_shapes(cfg):
      x = rng.standard_normal((batch, n_in), np.float32)
      w = (rng.standard_normal((count, n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
      xj, wj = jnp.asarray(x), jnp.asarray(w)
      # The `count` matmuls of a shape in one program (a scan over stacked weights, as the
      # scanned layers run): no dispatch per matmul.
      dots = jax.jit(lambda a, ws: jax.lax.scan(lambda c, v: (c, a @ v), 0, ws)[1])
      t_xla = min(common.time_it(lambda: dots(xj, wj).block_until_ready(), args.repeats))
      xt, wt = torch.from_numpy(x), [torch.from_numpy(v) for v in w]
      with torch.no_grad():
        t_torch = min(common.time_it(lambda: [torch.matmul(xt, v) for v in wt], args.repeats))
      xla_s += t_xla
      torch_s += t_torch
      flops += count * 2.0 * batch * n_in * n_out
    row = dict(batch=batch, xla_gflops=round(flops / xla_s / 1e9, 1),
               torch_gflops=round(flops / torch_s / 1e9, 1),
               xla_matmul_tok_s=round(batch / xla_s, 1),
               torch_matmul_tok_s=round(batch / torch_s, 1),
               xla_over_torch=round(torch_s / xla_s, 3))
    out.append(row)
    rows.append([batch, row["xla_gflops"], row["torch_gflops"], row["xla_matmul_tok_s"],
                 row["torch_matmul_tok_s"], f"{row['xla_over_torch']:.2f}x"])
  print(f"{args.model_path}: matmuls of one decode step ({sum(c for *_, c in step_shapes(cfg))} "
        f"per step), float32, best of {args.repeats}; torch {torch.__version__}, "
        f"{args.torch_threads} threads")
  print(common.table(["batch", "XLA GFLOP/s", "torch GFLOP/s", "XLA matmul-only tok/s",
                      "torch matmul-only tok/s", "XLA / torch"], rows))
  print(json.dumps(dict(rows=out)))


if __name__ == "__main__":
  main()
