"""The GRPO training loop: data -> rollout (jit) -> rewards -> advantages and reference
log-probs (jit) -> update (jit), with metrics and periodic held-out evaluation."""

from __future__ import annotations

import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.data.arithmetic import AdditionTask
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import init_params
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rewards.exact_match import exact_match_reward
from grpo_jax.rl.advantages import broadcast_to_tokens, group_normalized_advantages
from grpo_jax.rollout.sampler import Rollout, generate
from grpo_jax.train.grpo_step import Batch, make_update_step
from grpo_jax.train.metrics import MetricsWriter
from grpo_jax.train.state import TrainState, create_train_state, make_optimizer, step_key
from grpo_jax.train.warmup import run_warmup


def build_task(config):
  return AdditionTask(config.task.num_digits, config.task.test_size,
                      config.rollout.max_new_tokens, config.task.fixed_width,
                      config.task.reverse_answer)


def make_prepare_batch(model_cfg: ModelConfig, rl_cfg, group_size: int, temperature: float):
  """Jitted: rollout + rewards -> Batch (advantages, old and reference log-probs)."""

  @jax.jit
  def prepare(params, ref_params, rollout: Rollout, rewards):
    scale = rl_cfg.advantage == "grpo"
    adv = group_normalized_advantages(rewards, group_size, rl_cfg.advantage_eps, scale)
    score = functools.partial(completion_logprobs, model_cfg=model_cfg,
                              prompt_tokens=rollout.prompt_tokens,
                              prompt_mask=rollout.prompt_mask,
                              completion_tokens=rollout.completion_tokens,
                              completion_mask=rollout.completion_mask,
                              temperature=temperature)
    old_logprobs, _ = score(params)
    ref_logprobs, _ = score(ref_params) if rl_cfg.kl_coef > 0 else (old_logprobs, None)
    return Batch(rollout.prompt_tokens, rollout.prompt_mask, rollout.completion_tokens,
                 rollout.completion_mask, old_logprobs, ref_logprobs,
                 broadcast_to_tokens(adv, rollout.completion_mask))

  return prepare


def evaluate(params, task, model_cfg: ModelConfig, train_cfg) -> dict:
  """Greedy exact-match accuracy on the first train.eval_size held-out problems."""
  batch = task.test_batch(train_cfg.eval_size)
  correct = []
  for start in range(0, train_cfg.eval_size, train_cfg.eval_batch_size):
    sl = slice(start, start + train_cfg.eval_batch_size)
    r = generate(params, batch.prompt_tokens[sl], batch.prompt_mask[sl], jax.random.key(0),
                 model_cfg=model_cfg, max_new_tokens=task.max_new_tokens, temperature=0.0,
                 eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id)
    correct.append(exact_match_reward(r.completion_tokens, r.completion_mask,
                                      batch.target_tokens[sl], batch.target_mask[sl]))
  return {"eval_accuracy": float(jnp.mean(jnp.concatenate(correct)))}


def train(config, workdir: str, log=print) -> TrainState:
  """Runs config.train.steps GRPO steps; writes config.json and metrics.jsonl in workdir."""
  config_lib.validate(config)
  task = build_task(config)
  model_cfg = ModelConfig.from_config_dict(config.model)
  if model_cfg.vocab_size < task.tokenizer.vocab_size:
    raise config_lib.ConfigError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the task's vocabulary of "
        f"{task.tokenizer.vocab_size}; raise model.vocab_size.")
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  open(os.path.join(workdir, "metrics.jsonl"), "w").close()

  r_cfg, rl_cfg, t_cfg = config.rollout, config.rl, config.train
  base_key = jax.random.key(config.seed)
  params = init_params(model_cfg, jax.random.fold_in(base_key, 0))
  log(f"model: {sum(x.size for x in jax.tree.leaves(params)):,} parameters")
  params = run_warmup(params, task, model_cfg, config.warmup, config.seed, log)

  updates_per_step = rl_cfg.num_iterations * rl_cfg.num_minibatches
  optimizer = make_optimizer(config.optim, t_cfg.steps * updates_per_step)
  state = create_train_state(params, optimizer, jax.random.fold_in(base_key, 1))
  prepare = make_prepare_batch(model_cfg, rl_cfg, r_cfg.group_size, r_cfg.temperature)
  update_step = make_update_step(model_cfg, rl_cfg, optimizer, r_cfg.temperature)
  sample = functools.partial(generate, model_cfg=model_cfg,
                             max_new_tokens=r_cfg.max_new_tokens,
                             temperature=r_cfg.temperature, top_k=r_cfg.top_k,
                             top_p=r_cfg.top_p, eos_id=task.tokenizer.eos_id,
                             pad_id=task.tokenizer.pad_id)

  writer = MetricsWriter(workdir, t_cfg.steps)
  eval_metrics = evaluate(state.params, task, model_cfg, t_cfg)
  writer.write(0, eval_metrics)
  log(f"step    0/{t_cfg.steps} | eval_acc {eval_metrics['eval_accuracy']:.3f}")
  start = time.perf_counter()
  for _ in range(t_cfg.steps):
    t0 = time.perf_counter()
    prompts = task.train_batch(int(state.data_position), r_cfg.num_prompts, config.seed)
    repeat = lambda x: np.repeat(x, r_cfg.group_size, axis=0)  # noqa: E731  groups contiguous
    rollout = sample(state.params, repeat(prompts.prompt_tokens),
                     repeat(prompts.prompt_mask), step_key(state, 0))
    rewards = exact_match_reward(rollout.completion_tokens, rollout.completion_mask,
                                 repeat(prompts.target_tokens), repeat(prompts.target_mask))
    batch = prepare(state.params, state.ref_params, rollout, rewards)
    state, metrics = update_step(state, batch)
    state = state.replace(data_position=state.data_position + r_cfg.num_prompts)
    metrics = jax.device_get(metrics)
    step = int(state.step)

    groups = np.asarray(rewards).reshape(-1, r_cfg.group_size)
    metrics.update(
        reward_mean=float(groups.mean()), reward_std=float(groups.std()),
        frac_groups_all_same=float(np.mean(groups.min(1) == groups.max(1))),
        response_len=float(np.asarray(rollout.completion_mask).sum(1).mean()),
        truncated_frac=float(np.asarray(rollout.truncated).mean()))
    if step % t_cfg.eval_every == 0 or step == t_cfg.steps:
      metrics.update(evaluate(state.params, task, model_cfg, t_cfg))
    now = time.perf_counter()
    tokens = int(np.asarray(rollout.prompt_mask).sum() + np.asarray(rollout.completion_mask).sum())
    metrics.update(step_time_s=now - t0, tokens_per_s=tokens / (now - t0),
                   elapsed_s=now - start)
    writer.write(step, metrics)
    writer.progress(step, metrics, (now - start) / step)
  writer.close()
  return state
