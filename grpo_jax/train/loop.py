"""The training loop: data -> rollout (jit) -> rewards (host) -> advantages, old / reference
log-probs and values (jit) -> update (jit), with metrics and held-out evaluation."""

from __future__ import annotations

import functools
import os
import time

import jax
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.value_head import init_value_params
from grpo_jax.parallel import distributed
from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.mesh import (batch_axis_size, bytes_per_device, make_mesh, place_tree,
                                    shard_batch, tree_shardings)
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.checkpoint import Checkpoints
from grpo_jax.train.collect import collect
from grpo_jax.train.experience import make_prepare_batch, step_rollout_kl
from grpo_jax.train.evaluation import evaluate
from grpo_jax.train.faults import Preempted, TerminationFlag, check_skips
from grpo_jax.train.metrics import MetricsWriter, keep_records_until
from grpo_jax.train.setup import build_model, build_task, uses_checkpoint
from grpo_jax.train.state import (TrainState, create_train_state, end_of_step, make_optimizer,
                                  step_key)
from grpo_jax.train.update import make_update_step
from grpo_jax.train.warmup import run_warmup
from grpo_jax.train.workdir import record_start, write_config


def _check_batches_fit_mesh(config, mesh) -> None:
  """Every batch must split evenly over the mesh's data x fsdp devices (checked up front)."""
  size = batch_axis_size(mesh)
  r, t = config.rollout, config.train
  batch = r.num_prompts * r.group_size
  for name, value in ((f"the rollout batch (rollout.num_prompts={r.num_prompts} x "
                       f"rollout.group_size={r.group_size})", batch),
                      ("a minibatch", batch // config.rl.num_minibatches),
                      ("a micro-batch", batch // config.rl.num_minibatches //
                       config.rl.num_micro_batches),
                      ("train.eval_batch_size", t.eval_batch_size)):
    if value % size:
      raise config_lib.ConfigError(
          f"{name} = {value} does not split over the {size} devices of the mesh's data x fsdp "
          f"axes ({mesh.shape['data']} x {mesh.shape['fsdp']}); make it a multiple of {size}.")
  if config.rl.advantage == "remax" and r.num_prompts % size:
    raise config_lib.ConfigError(
        f"rl.advantage='remax' decodes one greedy row per prompt: rollout.num_prompts="
        f"{r.num_prompts} must be a multiple of the {size} data x fsdp devices.")


def rollout_metrics(collected, group_size: int) -> dict:
  rewards = np.asarray(collected.inputs.rewards).reshape(-1, group_size)
  mask = np.asarray(collected.rollout.completion_mask)
  return dict(reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
              frac_groups_all_same=float(np.mean(rewards.min(1) == rewards.max(1))),
              response_len=float(mask.sum(1).mean()),
              truncated_frac=float(np.asarray(collected.rollout.truncated).mean()),
              sampling_rounds=collected.sampling_rounds,
              groups_without_spread=collected.groups_without_spread)


def step_metrics(update_metrics, prep_metrics, collected, kl_coef, config) -> dict:
  """One step's metrics record (before evaluation and timing) from host values."""
  metrics = {**update_metrics, **prep_metrics,
             **rollout_metrics(collected, config.rollout.group_size), "kl_coef": float(kl_coef)}
  if config.train.on_reward_error == "zero":
    metrics["reward_errors"] = collected.reward_errors
  return metrics


def step_tokens(rollout) -> int:
  """Prompt and completion tokens of a step's rollout (for tokens/s)."""
  return int(np.asarray(rollout.prompt_mask).sum() + np.asarray(rollout.completion_mask).sum())


def initial_state(config, model_cfg, params, optimizer, base_key) -> TrainState:
  """The state at step 0 from the starting policy (a frozen reference copy, a fresh critic)."""
  value_params = init_value_params(config.rl.value_head, model_cfg, params,
                                   jax.random.fold_in(base_key, 2))
  return create_train_state(params, optimizer, jax.random.fold_in(base_key, 1), value_params,
                            config.rl.kl_coef)


def train(config, workdir: str, log=print) -> TrainState:
  """Runs RL steps until config.train.steps, resuming from the newest checkpoint in
  workdir/checkpoints if there is one (without the warm-up, whose result it holds); writes
  config.json, run_info.json and metrics.jsonl.

  Raises faults.Preempted after checkpointing the current step when SIGTERM arrives, and
  faults.RunStopped (RewardError included) when the run cannot go on.
  """
  config_lib.validate(config)
  distributed.initialize(config.get("distributed"))
  try:
    mesh = make_mesh(config.mesh)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  _check_batches_fit_mesh(config, mesh)
  if not distributed.is_main_process():
    log = lambda *a, **k: None  # noqa: E731  process 0 speaks and writes for everyone
  task = build_task(config, log)
  base_key = jax.random.key(config.seed)
  model_cfg, params = build_model(config, jax.random.fold_in(base_key, 0))
  if model_cfg.vocab_size < len(task.tokenizer):
    raise config_lib.ConfigError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
        f"{len(task.tokenizer)} tokens; raise model.vocab_size.")
  main_process = distributed.is_main_process()
  if main_process:
    write_config(config, workdir)
  rl, t_cfg = config.rl, config.train
  log(f"model: {sum(x.size for x in jax.tree.leaves(params)):,} parameters")
  optimizer = make_optimizer(config.optim, t_cfg.steps * rl.num_iterations * rl.num_minibatches)
  ckpts = Checkpoints(os.path.join(workdir, "checkpoints"), t_cfg.keep_checkpoints, log)
  try:
    with TerminationFlag() as sigterm:
      template = jax.eval_shape(
          lambda p, k: initial_state(config, model_cfg, p, optimizer, k), params, base_key)
      state = ckpts.restore_latest(template)
      resumed = state is not None
      metrics_path = os.path.join(workdir, "metrics.jsonl")
      if resumed and main_process:
        record_start(workdir, int(state.step))
        dropped = keep_records_until(metrics_path, int(state.step))
        log(f"resumed from checkpoint {ckpts.directory}/{int(state.step)} (no warm-up); "
            f"dropped {dropped} metrics records written after it")
      elif not resumed:
        if main_process:
          record_start(workdir, None)
          keep_records_until(metrics_path, -1)
        params = run_warmup(params, task, model_cfg, config.warmup, config.seed, log)
        state = initial_state(config, model_cfg, params, optimizer, base_key)
      del params  # the state holds them (fresh) or a restored copy replaced them
      state = place_tree(state, mesh)
      log(f"mesh (data, fsdp, tensor) = {tuple(mesh.shape.values())} over {mesh.size} devices, "
          f"{jax.process_count()} process(es); per device: params "
          f"{bytes_per_device(state.params) / 2**20:.2f} MiB, optimizer state "
          f"{bytes_per_device(state.opt_state) / 2**20:.2f} MiB, reference "
          f"{bytes_per_device(state.ref_params) / 2**20:.2f} MiB")
      return _run(config, workdir, task, model_cfg, optimizer, base_key, state, resumed, ckpts,
                  sigterm, log, mesh)
  finally:
    ckpts.close()


def _run(config, workdir, task, model_cfg, optimizer, base_key, state, resumed, ckpts,
         sigterm, log, mesh) -> TrainState:
  """The RL steps from state.step to config.train.steps (see `train`)."""
  r_cfg, rl, t_cfg = config.rollout, config.rl, config.train
  batch_size = r_cfg.num_prompts * r_cfg.group_size
  prepare = make_prepare_batch(model_cfg, rl, r_cfg.group_size, r_cfg.temperature,
                               r_cfg.max_new_tokens)
  state_shardings = tree_shardings(state, mesh)
  update_step = make_update_step(model_cfg, rl, optimizer, r_cfg.temperature, state_shardings)
  finish_step = jax.jit(functools.partial(end_of_step, rl=rl, batch_size=batch_size),
                        out_shardings=state_shardings)
  common = dict(model_cfg=model_cfg, max_new_tokens=r_cfg.max_new_tokens,
                eos_id=task.eos_id, pad_id=task.pad_id, mesh=mesh)

  def sample(p, tokens, mask, key):
    return generate(p, *shard_batch((tokens, mask), mesh), key, temperature=r_cfg.temperature,
                    top_k=r_cfg.top_k, top_p=r_cfg.top_p, **common)

  def greedy(p, tokens, mask):
    return generate(p, *shard_batch((tokens, mask), mesh), jax.random.key(0), temperature=0.0,
                    **common)

  eval_key = jax.random.fold_in(base_key, 3)
  run_eval = lambda p: evaluate(p, task, model_cfg, t_cfg, r_cfg, eval_key, mesh)  # noqa: E731
  writer = MetricsWriter(workdir, t_cfg.steps, enabled=distributed.is_main_process())
  try:
    if not resumed:
      eval_metrics = run_eval(state.params)
      writer.write(0, eval_metrics)
      log(f"step    0/{t_cfg.steps} | eval_acc {eval_metrics['eval_accuracy']:.3f}")
      if t_cfg.checkpoint_every:
        ckpts.save(state)
    first, start = int(to_host(state.step)), time.perf_counter()
    while int(to_host(state.step)) < t_cfg.steps:
      if sigterm.requested:
        ckpts.save(state)
        raise Preempted(f"SIGTERM: saved checkpoint {ckpts.directory}/{int(state.step)}; run "
                        f"the same command again to resume from it.")
      t0 = time.perf_counter()
      collected = collect(state, task, config, sample, greedy, step_key(state, 0),
                          on_reward_error=t_cfg.on_reward_error)
      rollout_on_mesh, inputs_on_mesh = shard_batch((collected.rollout, collected.inputs), mesh)
      batch, prep_metrics = prepare(state.params, state.value_params, state.ref_params,
                                    state.kl_coef, rollout_on_mesh, inputs_on_mesh)
      state, metrics = update_step(state, batch)
      state = finish_step(state, rollout_kl=step_rollout_kl(prep_metrics, metrics))
      state = state.replace(data_position=jax.device_put(
          state.data_position + collected.prompts_consumed, state_shardings.data_position))
      metrics = step_metrics(to_host(metrics), to_host(prep_metrics), collected,
                             to_host(state.kl_coef), config)
      step = int(to_host(state.step))
      if step % t_cfg.eval_every == 0 or step == t_cfg.steps:
        metrics.update(run_eval(state.params))
      now = time.perf_counter()
      tokens = step_tokens(collected.rollout)
      metrics.update(step_time_s=now - t0, tokens_per_s=tokens / (now - t0),
                     elapsed_s=now - start)
      writer.write(step, metrics)
      writer.progress(step, metrics, (now - start) / (step - first))
      check_skips(int(to_host(state.consecutive_skips)), t_cfg.max_consecutive_skips, step)
      if (t_cfg.checkpoint_every and step % t_cfg.checkpoint_every == 0) or step == t_cfg.steps:
        ckpts.save(state)
  finally:
    writer.close()
  if uses_checkpoint(config) and t_cfg.export:
    host_params = to_host(state.params)  # collective: every process takes part
    if distributed.is_main_process():
      from grpo_jax.models.hf import export_hf_checkpoint
      out = os.path.join(workdir, "hf_export")
      export_hf_checkpoint(host_params, model_cfg, out, source_dir=config.model.path)
      log(f"exported the trained policy as a Hugging Face checkpoint: {out}")
  return state
