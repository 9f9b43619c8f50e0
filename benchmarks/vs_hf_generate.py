"""Our sampler against transformers' PyTorch `generate`, side by side on this machine.

The same random Qwen2-shaped checkpoint (benchmarks/common.py: 32k vocabulary, float32), the
same random prompts, greedy decoding of exactly N new tokens on both sides (HF:
min_new_tokens = max_new_tokens = N, do_sample=False, use_cache=True; ours: an eos id that
never occurs), batch 1, 8 and 32. Each side runs in its own process, warms up (compiles) first
and reports the best of --repeats timed calls; --rounds rounds alternate which side runs first
and each side's best round counts. The table also gives the fraction of greedy tokens on which
both agree. torch gets --torch-threads threads (default: all cores) and
OMP_WAIT_POLICY=PASSIVE (without it torch's OpenMP threads spin and, on a shared machine,
slow torch down several-fold; pass --omp-wait-policy ACTIVE to see that).

    python benchmarks/vs_hf_generate.py --models qwen2-4L-256 qwen2-8L-512

A real checkpoint: --model-path DIR, or a name `python -m grpo_jax.fetch_model` fetched (e.g.
--models smollm2-135m-instruct). Its prompts are the chat_arithmetic task's held-out questions
("What is a + b? Answer with a single number.") in the model's chat template, the first
`batch` of them, left-padded to the batch's longest (--prompt-len does not apply). Both sides
still decode exactly N tokens: ours with an eos id that never occurs, HF with
eos_token_id=None (which replaces the checkpoint's own; min_new_tokens then has nothing to
suppress), so a greedy <eos> is just another token on both sides and the tokens compare.

    python benchmarks/vs_hf_generate.py --models smollm2-135m-instruct --batches 1 8 32 64
"""

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402


def model_dir(model: str) -> str:
  """The checkpoint folder of `model`: a random shape of common.SHAPES (written once), a
  folder, or a name grpo_jax.fetch_model fetched."""
  if model in common.SHAPES:
    return common.checkpoint(model)
  if os.path.isdir(model):
    return model
  from grpo_jax.fetch_model import fetched_model_dir  # noqa: PLC0415
  folder = fetched_model_dir(model)
  if folder is None:
    sys.exit(f"--models {model}: not a random shape ({', '.join(common.SHAPES)}), a folder, "
             f"or a fetched model; run python -m grpo_jax.fetch_model {model} first.")
  return str(folder)


@functools.lru_cache(maxsize=None)
def chat_task(folder: str):
  """The chat_arithmetic task (configs/grpo_smollm2.py's settings) on `folder`'s tokenizer."""
  from grpo_jax.data.chat_arithmetic import ChatArithmeticTask  # noqa: PLC0415
  from grpo_jax.data.tokenizer import load_hf_tokenizer  # noqa: PLC0415
  return ChatArithmeticTask(load_hf_tokenizer(folder), 100, "+", 500,
                            "Answer with a single number.", True, 128, 16)


def prompts(model: str, batch: int, prompt_len: int):
  """(tokens (B, P) int32, mask (B, P) bool, pad id): random full-length prompts for a random
  shape; for a real checkpoint, chat_arithmetic's first `batch` held-out prompts, left-padded
  to the longest."""
  if model in common.SHAPES:
    return (*common.random_prompts(batch, prompt_len), common.PAD_ID)
  task = chat_task(model_dir(model))
  b = task.test_batch(batch)
  width = int(b.prompt_mask.sum(1).max())
  return b.prompt_tokens[:, -width:], b.prompt_mask[:, -width:], task.pad_id


def ours(args) -> dict:
  malloc = common.ours_setup()
  import jax
  import numpy as np
  from grpo_jax.models.hf import load_hf_checkpoint
  from grpo_jax.rollout.sampler import generate
  cfg, params = load_hf_checkpoint(model_dir(args.model))
  out = {}
  for batch in args.batches:
    tokens, mask, pad_id = prompts(args.model, batch, args.prompt_len)
    run = lambda: jax.block_until_ready(generate(  # noqa: E731
        params, tokens, mask, jax.random.key(0), model_cfg=cfg, max_new_tokens=args.new_tokens,
        temperature=0.0, eos_id=-1, pad_id=pad_id))
    times = common.time_it(run, args.repeats)
    out[batch] = dict(seconds=min(times), tokens=np.asarray(run().completion_tokens).tolist(),
                      prompt_len=int(tokens.shape[1]))
  return dict(results=out, settings=f"jax {jax.__version__}, XLA:CPU default threads, {malloc}",
              params=int(sum(x.size for x in jax.tree.leaves(params))))


def hf(args) -> dict:
  import numpy as np
  import torch
  from transformers import AutoModelForCausalLM
  settings = common.torch_setup(args.torch_threads)
  model = AutoModelForCausalLM.from_pretrained(model_dir(args.model),
                                               dtype=torch.float32).eval()
  out = {}
  for batch in args.batches:
    tokens, mask, pad_id = prompts(args.model, batch, args.prompt_len)
    ids, attn = torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))

    def run():
      with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=attn, do_sample=False, use_cache=True,
                              max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                              pad_token_id=pad_id, eos_token_id=None)
    times = common.time_it(run, args.repeats)
    new = run()[:, tokens.shape[1]:]
    assert new.shape[1] == args.new_tokens, new.shape
    out[batch] = dict(seconds=min(times), tokens=new.tolist())
  return dict(results=out, settings=f"{settings}, attention {model.config._attn_implementation}")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", nargs="+", default=["qwen2-4L-256", "qwen2-8L-512"],
                      help="random shapes (common.SHAPES), checkpoint folders or fetched names")
  parser.add_argument("--model-path", help="a real checkpoint folder (replaces --models)")
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
  parser.add_argument("--prompt-len", type=int, default=32)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--torch-threads", type=int, default=os.cpu_count())
  parser.add_argument("--omp-wait-policy", default="PASSIVE")
  parser.add_argument("--peer-malloc", choices=["default", "tuned"], default="default",
                      help="HF's process: glibc's default malloc, or ours (common.TUNED_GLIBC)")
  parser.add_argument("--side", choices=["ours", "hf"], help=argparse.SUPPRESS)
  parser.add_argument("--model", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.side:
    print(json.dumps((ours if args.side == "ours" else hf)(args)))
    return
  models = [args.model_path] if args.model_path else args.models
  print(common.header())
  rows, settings, notes = [], {}, []
  for model in models:
    model_dir(model)
    side_args = ["--model", model, "--batches", *map(str, args.batches), "--prompt-len",
                 str(args.prompt_len), "--new-tokens", str(args.new_tokens), "--repeats",
                 str(args.repeats), "--torch-threads", str(args.torch_threads)]
    pairs = common.alternate(
        args.rounds, lambda: common.run_side(__file__, ["--side", "ours", *side_args]),
        lambda: common.run_side(__file__, ["--side", "hf", *side_args],
                                {"OMP_WAIT_POLICY": args.omp_wait_policy, **common.peer_env(args.peer_malloc)}))
    settings = dict(ours=pairs[0][0]["settings"], hf=pairs[0][1]["settings"])
    params = (common.num_params(model) if model in common.SHAPES else pairs[0][0]["params"])
    if model not in common.SHAPES:
      widths = ", ".join(f"{b}: {r['prompt_len']}" for b, r in pairs[0][0]["results"].items())
      notes.append(f"{model}: chat_arithmetic prompts, left-padded widths by batch {widths}")
    for batch in map(str, args.batches):
      x = min((a["results"][batch] for a, _ in pairs), key=lambda r: r["seconds"])
      y = min((b["results"][batch] for _, b in pairs), key=lambda r: r["seconds"])
      n = int(batch) * args.new_tokens
      agree = sum(u == v for r, s in zip(x["tokens"], y["tokens"]) for u, v in zip(r, s)) / n
      rows.append([model, f"{params / 1e6:.1f}M", batch, f"{n / x['seconds']:,.0f}",
                   f"{n / y['seconds']:,.0f}", f"{y['seconds'] / x['seconds']:.2f}x",
                   f"{agree:.3f}"])
  print(f"ours: {settings['ours']}; HF: {settings['hf']}")
  prompt = (f"prompt {args.prompt_len} tokens" if any(m in common.SHAPES for m in models)
            else "chat prompts")
  print(f"{prompt}, {args.new_tokens} new tokens, greedy, best of "
        f"{args.repeats} calls x {args.rounds} rounds; tokens/s = batch x new tokens / wall time of the whole generate call")
  for note in notes:
    print(note)
  print(common.table(["model", "params", "batch", "ours tok/s", "HF generate tok/s",
                      "ours / HF", "same greedy tokens"], rows))


if __name__ == "__main__":
  main()
