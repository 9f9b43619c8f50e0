"""One full GRPO step of ours, built from the pieces the training loop uses:

    generate (sampled, G completions per prompt) -> rewards (host) -> prepare (reference
    log-probs, group-normalised advantages; the old log-probs only with reuse_old_logprobs=False)
    -> update (PPO-clip + k3 KL, one AdamW step)

The reward is a dummy: the fraction of completion tokens equal to TARGET. Used by vs_trl.py,
scaling.py and update_step.py; not a benchmark on its own.
"""

from __future__ import annotations

import functools
import time

from benchmarks import common

TARGET = 7


def build(model: str, group_size: int, num_prompts: int, prompt_len: int, new_tokens: int,
          kl_coef: float = 0.04, learning_rate: float = 1e-6, dtype: str = "float32",
          reuse_old_logprobs: bool = True, donate: bool = False,
          shared_prompt_forward: bool = False):
  """(run_step, info): run_step() does one GRPO step, blocks until it is done and returns the
  seconds of its parts (rollout, prepare, update); info["last"] holds its state and batch
  (with donate=True the update donates the state, as a run's step does, and info["last"] holds
  no state: its buffers are reused). shared_prompt_forward: rl.shared_prompt_forward (each
  prompt runs once for its G completions in the reference and update passes)."""
  import jax
  import ml_collections
  import numpy as np

  from grpo_jax.defaults import rl_defaults
  from grpo_jax.models.hf import load_hf_checkpoint
  from grpo_jax.rollout.sampler import generate
  from grpo_jax.train.learner.experience import RewardInputs, make_prepare_batch
  from grpo_jax.train.learner.state import create_train_state, make_optimizer, step_key
  from grpo_jax.train.learner.update import make_update, make_update_step

  cfg, params = load_hf_checkpoint(common.checkpoint(model), dtype, dtype)
  rl = rl_defaults(advantage="grpo", kl_coef=kl_coef, loss_aggregation="token-mean",
                   num_iterations=1, num_minibatches=1,
                   reuse_old_logprobs=reuse_old_logprobs,
                   shared_prompt_forward=shared_prompt_forward)
  optim = ml_collections.ConfigDict(dict(learning_rate=learning_rate, warmup_steps=0,
                                         weight_decay=0.0, b1=0.9, b2=0.999, max_grad_norm=1.0))
  optimizer = make_optimizer(optim, 1000)
  box = {"state": create_train_state(params, optimizer, jax.random.key(1), kl_coef=kl_coef)}
  sample = functools.partial(generate, model_cfg=cfg, max_new_tokens=new_tokens,
                             temperature=1.0, eos_id=-1, pad_id=common.PAD_ID,
                             group_size=group_size)  # each prompt prefilled once
  prepare = jax.jit(make_prepare_batch(cfg, rl, group_size, 1.0, new_tokens))
  update = (jax.jit(make_update(cfg, rl, optimizer, 1.0, group_size), donate_argnums=0)
            if donate else make_update_step(cfg, rl, optimizer, 1.0, group_size))
  tokens, mask = common.random_prompts(num_prompts, prompt_len)
  times = {}

  def run_step():
    state = box["state"]
    t0 = time.perf_counter()
    rollout = sample(state.params, tokens, mask, step_key(state, 0))
    done = np.asarray(rollout.completion_mask)  # host: the reward needs the tokens
    t1 = time.perf_counter()
    hits = (np.asarray(rollout.completion_tokens) == TARGET) & done
    reward = (hits.sum(1) / np.maximum(done.sum(1), 1)).astype(np.float32)
    inputs = RewardInputs(reward, {}, np.int32(0))  # GRPO needs no extras
    batch, _ = prepare(state, rollout, inputs)
    jax.block_until_ready(batch)
    t2 = time.perf_counter()
    state, metrics = update(state, batch)
    jax.block_until_ready(metrics)
    t3 = time.perf_counter()
    info["last"] = dict(state=None if donate else box["state"], batch=batch)
    box["state"] = state
    times.update(rollout=t1 - t0, prepare=t2 - t1, update=t3 - t2)
    return times

  info = dict(update=update, params=sum(x.size for x in jax.tree.leaves(params)))
  return run_step, info
