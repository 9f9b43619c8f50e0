"""The sampler with quantised weights (rollout.weight_dtype, models/quantized.py) against full
precision, on a real checkpoint: tokens/s, the compiled sampler's memory, and how far the
quantised policy's log-probs are from the full-precision policy's.

    python benchmarks/quantized_rollout.py                 # SmolLM2-135M-Instruct (fetch_model)
    python benchmarks/quantized_rollout.py --model DIR --rows 32 --prompt-len 64 --new-tokens 64

rows = rows / G prompts x G samples (--group-size), random prompt ids, sampled at temperature
1, exactly --new-tokens steps (an eos id that never occurs). tokens/s = rows x new tokens /
the whole sampler call (prefill included, the quantised copy included), best of --repeats
after a compiling call, both weight dtypes alternating in one process. Memory: XLA's
memory_analysis of the compiled sampler (arguments: the params as the trainer holds them;
temp: what the call allocates, the quantised copy included). log-prob gap: the mean |log pi_q
- log pi| over the sampled tokens, pi the full-precision policy's teacher-forced log-probs.
One JSON line per weight dtype.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default=os.path.expanduser(
      "~/.cache/grpo_jax/models/smollm2-135m-instruct"))
  p.add_argument("--rows", type=int, default=32)
  p.add_argument("--group-size", type=int, default=4)
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--dtypes", nargs="+", default=["", "int8"])
  args = p.parse_args(argv)

  import jax
  import numpy as np
  from grpo_jax.models import hf
  from grpo_jax.models.quantized import quantize_layers, weight_bytes
  from grpo_jax.rollout.sampler import Sampling, _sample
  from grpo_jax.train.learner.forward import policy_and_values

  cfg, params = hf.load_hf_checkpoint(args.model)
  params = jax.device_put(params)
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, cfg.vocab_size, size=(args.rows // args.group_size,
                                                  args.prompt_len), dtype=np.int32)
  mask = np.ones_like(prompts, bool)
  key = jax.random.key(0)
  samplers = {d: Sampling(cfg, args.new_tokens, eos_id=-1, pad_id=0).grouped(
      args.group_size).quantized(d) for d in args.dtypes}
  results = {}
  for d, s in samplers.items():
    compiled = _sample.lower(params, prompts, mask, key, None, sampling=s).compile()
    memory = compiled.memory_analysis()
    rollout = jax.block_until_ready(s(params, prompts, mask, key))
    logp = policy_and_values(params, None, rollout, cfg, "none", 1.0)[0]
    kept = np.asarray(rollout.completion_mask)
    gap = float(np.abs(np.asarray(logp) - np.asarray(rollout.logprobs))[kept].mean())
    layers = quantize_layers(params, d)["layers"] if d else params["layers"]
    results[d] = dict(weight_dtype=d or "float32", layer_weight_mib=weight_bytes(layers) / 2**20,
                      argument_mib=memory.argument_size_in_bytes / 2**20,
                      temp_mib=memory.temp_size_in_bytes / 2**20, logprob_gap=gap, times=[])
  for _ in range(args.repeats):  # both dtypes alternating, so load drifts hit both
    for d, s in samplers.items():
      results[d]["times"] += common.time_it(
          lambda s=s: jax.block_until_ready(s(params, prompts, mask, key)), 1, 0)
  print(common.header())
  rows = []
  for d, r in results.items():
    r["tokens_per_s"] = args.rows * args.new_tokens / min(r.pop("times"))
    r.update(model=os.path.basename(args.model.rstrip("/")), rows=args.rows,
             prompt_len=args.prompt_len, new_tokens=args.new_tokens, backend=jax.default_backend())
    rows.append([r["weight_dtype"], f"{r['tokens_per_s']:.0f}", f"{r['layer_weight_mib']:.1f}",
                 f"{r['argument_mib']:.1f}", f"{r['temp_mib']:.1f}", f"{r['logprob_gap']:.4f}"])
  print(common.table(["weights", "tokens/s", "layer weights MiB", "arguments MiB", "temp MiB",
                      "log-prob gap"], rows))
  for r in results.values():
    print(json.dumps(r))


if __name__ == "__main__":
  main()
