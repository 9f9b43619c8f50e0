"""A full GRPO step of ours against TRL's GRPOTrainer, side by side on this machine.

Both sides train the same random Qwen2-shaped checkpoint (benchmarks/common.py) with the same
settings: P-token random prompts (TRL gets them as words of a word-level tokenizer, one token
each), G completions per prompt of exactly N sampled tokens (temperature 1; TRL:
min_new_tokens = N, ours: an eos id that never occurs), a dummy reward (the fraction of one
token), group-normalised advantages, PPO-clip 0.2 with the k3 KL term (beta > 0), token-mean
loss (TRL: loss_type="dapo"), mu = 1 (num_iterations=1), one AdamW step per generation batch,
float32, no gradient checkpointing (TRL's default is on; ours has none), dropout off, no vLLM.
A step is rollout + reference log-probs + update: at mu = 1 both sides use the current
log-probs as the old ones (ours: rl.reuse_old_logprobs; --recompute-old-logprobs makes ours do
the extra forward pass instead, to see what it costs).

Each side runs in its own process; the first step (compilation, warm-up) is not timed and a
round's figure is the median seconds per step of the next --steps. --rounds rounds alternate
which side runs first, and each side's best round counts. torch: --torch-threads threads
(default all cores) and OMP_WAIT_POLICY=PASSIVE (see vs_hf_generate.py).

    python benchmarks/vs_trl.py --models qwen2-4L-256
    python benchmarks/vs_trl.py --models qwen2.5-0.5b --group-size 4 --num-prompts 2 \
        --prompt-len 64 --new-tokens 64 --steps 2 --rounds 1   # the Qwen2.5-0.5B shape

Each side reports its process's peak RSS; one JSON line per model ends the output.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common, grpo_step  # noqa: E402


def ours(args) -> dict:
  malloc = common.ours_setup()
  import jax
  run_step, _ = grpo_step.build(args.model, args.group_size, args.num_prompts, args.prompt_len,
                                args.new_tokens, kl_coef=args.beta,
                                reuse_old_logprobs=not args.recompute_old_logprobs,
                                donate=True,  # the state held once, as in a run
                                shared_prompt_forward=args.shared_prompt_forward)
  run_step()  # compiles
  steps, parts = [], []
  for _ in range(args.steps):
    start = time.perf_counter()
    parts.append(dict(run_step()))
    steps.append(time.perf_counter() - start)
  split = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
  return dict(steps=steps, split=split, settings=f"jax {jax.__version__}, {malloc}",
              peak_rss_gib=peak_rss_gib())


def trl(args) -> dict:
  import torch
  import trl as trl_lib
  from datasets import Dataset
  from transformers import AutoModelForCausalLM, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer
  settings = common.torch_setup(args.torch_threads)
  total = args.steps + 1
  tokens, _ = common.random_prompts(args.num_prompts * total, args.prompt_len)
  data = Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in row) for row in tokens]})
  target = f"t{grpo_step.TARGET}"

  def reward(completions, **_):
    return [c.split().count(target) / max(len(c.split()), 1) for c in completions]

  class StepTimes(TrainerCallback):
    def __init__(self):
      self.ends = []

    def on_step_end(self, *_, **__):
      self.ends.append(time.perf_counter())

  timer = StepTimes()
  config = GRPOConfig(
      output_dir=os.path.join(common.bench_dir(), "trl_out"), num_generations=args.group_size,
      max_completion_length=args.new_tokens, generation_kwargs={"min_new_tokens": args.new_tokens},
      per_device_train_batch_size=args.group_size * args.num_prompts,
      gradient_accumulation_steps=1, num_iterations=1, beta=args.beta, epsilon=0.2,
      loss_type="dapo", scale_rewards="group", temperature=1.0, learning_rate=1e-6,
      max_grad_norm=1.0, optim="adamw_torch", gradient_checkpointing=False,
      disable_dropout=True, use_vllm=False, use_cpu=True, bf16=False, fp16=False,
      max_steps=total, logging_steps=10_000, save_strategy="no", report_to=[],
      shuffle_dataset=False)
  model = AutoModelForCausalLM.from_pretrained(common.checkpoint(args.model),
                                               dtype=torch.float32)
  trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                        processing_class=common.word_tokenizer(), callbacks=[timer])
  trainer.train()
  steps = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
  return dict(steps=steps, settings=f"trl {trl_lib.__version__}, {settings}",
              peak_rss_gib=peak_rss_gib())


def peak_rss_gib() -> float:
  """This process's peak resident memory (ru_maxrss is KiB on Linux)."""
  import resource
  return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", nargs="+", default=["qwen2-4L-256"])
  parser.add_argument("--group-size", type=int, default=8)
  parser.add_argument("--num-prompts", type=int, default=4)
  parser.add_argument("--prompt-len", type=int, default=32)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--beta", type=float, default=0.04)
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--torch-threads", type=int, default=os.cpu_count())
  parser.add_argument("--omp-wait-policy", default="PASSIVE")
  parser.add_argument("--peer-malloc", choices=["default", "tuned"], default="default",
                      help="TRL's process: glibc's default malloc, or ours (common.TUNED_GLIBC)")
  parser.add_argument("--recompute-old-logprobs", action="store_true",
                      help="ours: a separate old-log-prob forward pass "
                      "(rl.reuse_old_logprobs=False)")
  parser.add_argument("--shared-prompt-forward", action="store_true",
                      help="ours: each prompt runs once for its G completions in the reference "
                      "and update passes (rl.shared_prompt_forward)")
  parser.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
  parser.add_argument("--model", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.side:
    print(json.dumps((ours if args.side == "ours" else trl)(args)))
    return
  print(common.header())
  rows, settings, records = [], {}, []
  for model in args.models:
    common.checkpoint(model)
    side_args = ["--model", model, "--group-size", str(args.group_size), "--num-prompts",
                 str(args.num_prompts), "--prompt-len", str(args.prompt_len), "--new-tokens",
                 str(args.new_tokens), "--beta", str(args.beta), "--steps", str(args.steps),
                 "--torch-threads", str(args.torch_threads)] + (
                     ["--recompute-old-logprobs"] if args.recompute_old_logprobs else []) + (
                     ["--shared-prompt-forward"] if args.shared_prompt_forward else [])
    pairs = common.alternate(
        args.rounds, lambda: common.run_side(__file__, ["--side", "ours", *side_args]),
        lambda: common.run_side(__file__, ["--side", "trl", *side_args],
                                {"OMP_WAIT_POLICY": args.omp_wait_policy,
                                 **common.peer_env(args.peer_malloc)}))
    settings = dict(ours=pairs[0][0]["settings"], trl=pairs[0][1]["settings"])
    a = min((a for a, _ in pairs), key=lambda r: statistics.median(r["steps"]))
    x = statistics.median(a["steps"])
    y = min(statistics.median(b["steps"]) for _, b in pairs)
    rounds = " / ".join(f"{statistics.median(a['steps']):.2f} vs "
                        f"{statistics.median(b['steps']):.2f}" for a, b in pairs)
    split = " / ".join(f"{a['split'][k]:.2f}" for k in ("rollout", "prepare", "update"))
    b = min((b for _, b in pairs), key=lambda r: statistics.median(r["steps"]))
    rows.append([model, f"{common.num_params(model) / 1e6:.1f}M", f"{x:.2f}", split, f"{y:.2f}",
                 f"{y / x:.2f}x", rounds, f"{a['peak_rss_gib']} / {b['peak_rss_gib']}"])
    records.append(dict(model=model, params_m=round(common.num_params(model) / 1e6, 1),
                        ours_s_per_step=round(x, 3), trl_s_per_step=round(y, 3),
                        trl_over_ours=round(y / x, 3), ours_peak_rss_gib=a["peak_rss_gib"],
                        trl_peak_rss_gib=b["peak_rss_gib"]))
  print(f"ours: {settings['ours']}; TRL: {settings['trl']}")
  print(f"G={args.group_size}, {args.num_prompts} prompts/step ({args.group_size * args.num_prompts}"
        f" completions), prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, "
        f"beta={args.beta}, mu=1, old log-probs "
        f"{'recomputed' if args.recompute_old_logprobs else 'reused'} by ours, prompts "
        f"{'shared' if args.shared_prompt_forward else 'per row'} in ours' forward passes; "
        f"median s/step of {args.steps} steps after the first, best of "
        f"{args.rounds} rounds")
  print(common.table(["model", "params", "ours s/step", "ours rollout / prepare / update s",
                      "TRL s/step", "TRL / ours", "each round: ours vs TRL s/step",
                      "peak RSS GiB ours / TRL"], rows))
  for record in records:
    print(json.dumps(record))


if __name__ == "__main__":
  main()
