"""The training loop: data -> rollout (jit) -> rewards (host) -> advantages, old / reference
log-probs and values (jit) -> update (jit), with metrics and held-out evaluation."""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.data.arithmetic import AdditionTask
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import init_params
from grpo_jax.models.value_head import init_value_params
from grpo_jax.rewards.exact_match import exact_match_reward
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.collect import collect
from grpo_jax.train.experience import make_prepare_batch
from grpo_jax.train.metrics import MetricsWriter
from grpo_jax.train.state import (TrainState, create_train_state, end_of_step, make_optimizer,
                                  step_key)
from grpo_jax.train.update import make_update_step
from grpo_jax.train.warmup import run_warmup


def build_task(config):
  t = config.task
  return AdditionTask(t.num_digits, t.test_size, config.rollout.max_new_tokens, t.fixed_width,
                      t.reverse_answer)


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


def _prepare_workdir(config, workdir: str) -> None:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  open(os.path.join(workdir, "metrics.jsonl"), "w").close()


def _rollout_metrics(collected, group_size: int) -> dict:
  rewards = np.asarray(collected.inputs.rewards).reshape(-1, group_size)
  mask = np.asarray(collected.rollout.completion_mask)
  return dict(reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
              frac_groups_all_same=float(np.mean(rewards.min(1) == rewards.max(1))),
              response_len=float(mask.sum(1).mean()),
              truncated_frac=float(np.asarray(collected.rollout.truncated).mean()),
              sampling_rounds=collected.sampling_rounds,
              groups_without_spread=collected.groups_without_spread)


def train(config, workdir: str, log=print) -> TrainState:
  """Runs config.train.steps RL steps; writes config.json and metrics.jsonl in workdir."""
  config_lib.validate(config)
  task = build_task(config)
  model_cfg = ModelConfig.from_config_dict(config.model)
  if model_cfg.vocab_size < task.tokenizer.vocab_size:
    raise config_lib.ConfigError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the task's vocabulary of "
        f"{task.tokenizer.vocab_size}; raise model.vocab_size.")
  _prepare_workdir(config, workdir)

  r_cfg, rl, t_cfg = config.rollout, config.rl, config.train
  base_key = jax.random.key(config.seed)
  params = init_params(model_cfg, jax.random.fold_in(base_key, 0))
  log(f"model: {sum(x.size for x in jax.tree.leaves(params)):,} parameters")
  params = run_warmup(params, task, model_cfg, config.warmup, config.seed, log)

  optimizer = make_optimizer(config.optim, t_cfg.steps * rl.num_iterations * rl.num_minibatches)
  value_params = init_value_params(rl.value_head, model_cfg, params,
                                   jax.random.fold_in(base_key, 2))
  state = create_train_state(params, optimizer, jax.random.fold_in(base_key, 1), value_params,
                             rl.kl_coef)
  batch_size = r_cfg.num_prompts * r_cfg.group_size
  prepare = make_prepare_batch(model_cfg, rl, r_cfg.group_size, r_cfg.temperature,
                               r_cfg.max_new_tokens)
  update_step = make_update_step(model_cfg, rl, optimizer, r_cfg.temperature)
  finish_step = jax.jit(functools.partial(end_of_step, rl=rl, batch_size=batch_size))
  common = dict(model_cfg=model_cfg, max_new_tokens=r_cfg.max_new_tokens,
                eos_id=task.tokenizer.eos_id, pad_id=task.tokenizer.pad_id)
  sample = functools.partial(generate, temperature=r_cfg.temperature, top_k=r_cfg.top_k,
                             top_p=r_cfg.top_p, **common)
  greedy = lambda p, t, m: generate(p, t, m, jax.random.key(0), temperature=0.0, **common)  # noqa

  writer = MetricsWriter(workdir, t_cfg.steps)
  eval_metrics = evaluate(state.params, task, model_cfg, t_cfg)
  writer.write(0, eval_metrics)
  log(f"step    0/{t_cfg.steps} | eval_acc {eval_metrics['eval_accuracy']:.3f}")
  start = time.perf_counter()
  for _ in range(t_cfg.steps):
    t0 = time.perf_counter()
    collected = collect(state, task, config, sample, greedy, step_key(state, 0))
    batch, prep_metrics = prepare(state.params, state.value_params, state.ref_params,
                                  state.kl_coef, collected.rollout, collected.inputs)
    state, metrics = update_step(state, batch)
    state = finish_step(state, rollout_kl=prep_metrics["rollout_kl"])
    state = state.replace(data_position=state.data_position + collected.prompts_consumed)
    metrics = {**jax.device_get(metrics), **jax.device_get(prep_metrics),
               **_rollout_metrics(collected, r_cfg.group_size),
               "kl_coef": float(state.kl_coef)}
    step = int(state.step)
    if step % t_cfg.eval_every == 0 or step == t_cfg.steps:
      metrics.update(evaluate(state.params, task, model_cfg, t_cfg))
    now = time.perf_counter()
    rollout = collected.rollout
    tokens = int(np.asarray(rollout.prompt_mask).sum() + np.asarray(rollout.completion_mask).sum())
    metrics.update(step_time_s=now - t0, tokens_per_s=tokens / (now - t0),
                   elapsed_s=now - start)
    writer.write(step, metrics)
    writer.progress(step, metrics, (now - start) / step)
  writer.close()
  return state
