"""LoRA's cost on this machine: the rollout and the scoring forward with the adapters applied
beside the base (what the run does) against merging them once into full weights (W + s A B)
and running the plain model, and the RL step with LoRA against full fine-tuning.

    python benchmarks/lora.py [--shape qwen2-8L-512] [--rank 32] [--rows 32] [--prompt 64]
                              [--new 64] [--repeats 3]

Figures (best of --repeats, after a compile call): sampler_s (prefill + decode of --new tokens
for rows / 4 prompts x 4 samples), score_s (teacher-forced log-probs of the rows), merge_s
(W + s A B for every projection, jitted), and step_s (the whole jitted RL step, GRPO with KL,
state donated) for LoRA and for full fine-tuning. "merge once per step" costs merge_s +
the plain model's time; "unmerged" costs the LoRA time. One JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shape", default="qwen2-8L-512")
  p.add_argument("--rank", type=int, default=32)
  p.add_argument("--rows", type=int, default=32)
  p.add_argument("--prompt", type=int, default=64)
  p.add_argument("--new", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args(argv)

  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np

  from benchmarks import common
  from benchmarks.shapes import shape_table
  from grpo_jax.defaults import rl_defaults
  from grpo_jax.models import lora
  from grpo_jax.models.config import ModelConfig
  from grpo_jax.models.decoder import init_params
  from grpo_jax.models.scoring import completion_logprobs
  from grpo_jax.rollout.sampler import generate
  from grpo_jax.train.learner.experience import RewardInputs
  from grpo_jax.train.learner.state import create_train_state, make_optimizer
  from grpo_jax.train.learner.step import StepSpec, make_rl_step

  print(common.header())
  cfg = ModelConfig(**shape_table()[args.shape], lora_scale=lora.lora_scale(args.rank, args.rank))
  base = init_params(cfg, jax.random.key(0))
  adapters = lora.init_adapters(base, lora.TARGETS, args.rank, jax.random.key(1))
  adapters = jax.tree.map(lambda x: x + 0.01, adapters)  # B != 0, as after training
  adapted = lora.LoraParams(base, adapters)
  group, rows = 4, args.rows
  tokens, mask = common.random_prompts(rows // group, args.prompt)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  block = lambda tree: jax.tree.map(lambda x: x.block_until_ready(), tree)  # noqa: E731
  best = lambda fn: min(common.time_it(fn, args.repeats))  # noqa: E731

  sample = jax.jit(lambda prm: generate(prm, tokens, mask, jax.random.key(2), model_cfg=cfg,
                                        max_new_tokens=args.new, temperature=1.0,
                                        eos_id=-1, pad_id=0, group_size=group))
  rollout = sample(adapted)
  score = jax.jit(lambda prm: completion_logprobs(
      prm, cfg, rollout.prompt_tokens, rollout.prompt_mask, rollout.completion_tokens,
      rollout.completion_mask)[0])
  merge = jax.jit(lambda b, a: lora.merge(b, a, cfg.lora_scale))
  merged = merge(base, adapters)
  out = dict(shape=args.shape, rank=args.rank, rows=rows, prompt=args.prompt, new=args.new,
             params_m=round(lora.count(base) / 1e6, 1),
             adapter_m=round(lora.count(adapters) / 1e6, 2))
  out["merge_s"] = best(lambda: block(merge(base, adapters)))
  for name, prm in (("lora", adapted), ("plain", merged)):
    out[f"sampler_{name}_s"] = best(lambda: block(sample(prm)))
    out[f"score_{name}_s"] = best(lambda: block(score(prm)))

  rl = rl_defaults(kl_coef=0.001)
  optim = ml_collections.ConfigDict(dict(learning_rate=1e-5, warmup_steps=0, weight_decay=0.0,
                                         b1=0.9, b2=0.99, max_grad_norm=1.0))
  optimizer = make_optimizer(optim, 100)
  rewards = RewardInputs(jnp.asarray(np.arange(rows) % 2, jnp.float32), {},
                         jnp.int32(rows // group))
  step = jax.jit(make_rl_step(StepSpec(cfg, rl, optimizer, group, 1.0, args.new)),
                 donate_argnums=0)
  fresh = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  (the step donates its state)
  for name, make in (("lora", lambda: create_train_state(
                          fresh(adapters), optimizer, jax.random.key(3), kl_coef=0.001,
                          base_params=fresh(base))),
                     ("full", lambda: create_train_state(fresh(base), optimizer,
                                                         jax.random.key(3), kl_coef=0.001))):
    box = {"state": make()}

    def one():
      box["state"], metrics = step(box["state"], rollout, rewards)
      float(metrics["loss"])
    out[f"step_{name}_s"] = best(one)
  out = {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
  print(common.table(
      ["", "LoRA (adapters beside the base)", "plain model (merged weights)"],
      [["sampler s", out["sampler_lora_s"], out["sampler_plain_s"]],
       ["scoring forward s", out["score_lora_s"], out["score_plain_s"]],
       ["merge once s", "-", out["merge_s"]]]))
  print(f"RL step: LoRA {out['step_lora_s']} s, full fine-tuning {out['step_full_s']} s")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
