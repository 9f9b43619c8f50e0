"""The host experience source ("host", on-policy): each call samples the step's prompts with
the current policy, scores them on the host (train/collect.py: dynamic sampling, estimator
inputs, reward sources), then runs the one jitted RL step with the state donated."""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from grpo_jax.models.packing import token_capacity
from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.mesh import shard_batch
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.checkpoint import step_of
from grpo_jax.train.collect import Samplers, collect
from grpo_jax.train.experience_source import Run, register_experience_source, state_jit_options
from grpo_jax.train.faults import check_reward_error_fraction
from grpo_jax.train.metrics import rollout_metrics, step_record, step_tokens
from grpo_jax.train.samples import samples_due, train_samples
from grpo_jax.train.state import policy_params, step_key
from grpo_jax.train.step import make_rl_step


@register_experience_source("host")
def make_host_advance(run: Run, state, samples_out=None):
  """advance(state) -> (state, [per-seed records of the step], [its tokens]): the host path.
  On a step `samples_due`, the first seed's training samples are appended to samples_out."""
  config, axis, mesh = run.config, run.axis, run.mesh
  r_cfg = config.rollout
  sampling = Sampling.of(run.spec.model_cfg, run.task, r_cfg, mesh)
  place = ((lambda *xs: shard_batch(xs, mesh, replicate_indivisible=True))
           if mesh is not None else (lambda *xs: xs))
  grouped = sampling.grouped(r_cfg.group_size, config.rl.keep_sampling_mask,
                             record_routes=True).quantized(r_cfg.weight_dtype)
  samplers = Samplers(
      sample=axis.compile(lambda p, t, m, k: grouped.with_stats(p, *place(t, m), k)),
      greedy=axis.compile(lambda p, t, m: sampling.greedy()(p, *place(t, m),
                                                            jax.random.key(0))))
  rollout_keys = axis.compile(lambda s: step_key(s, 0))
  rl_steps = {}  # token capacity (None: unpacked) -> the RL step compiled for it

  def rl_step_for(rollout):
    """The jitted RL step for this rollout: with rl.pack_tokens, the one of its packed token
    capacity (models/packing.py: at most rl.pack_tokens of them over a run)."""
    capacity = None
    if config.rl.pack_tokens:
      rows, width = np.shape(rollout.completion_mask)[-2:]
      lengths = np.sum(to_host(rollout.completion_mask), axis=-1)
      capacity = token_capacity(lengths, rows // (config.rl.num_minibatches *
                                                  config.rl.num_micro_batches),
                                width - 1, config.rl.pack_tokens)
    if capacity not in rl_steps:
      spec = dataclasses.replace(run.spec, token_capacity=capacity)
      rl_steps[capacity] = axis.compile(make_rl_step(spec), **state_jit_options(state, run))
    return capacity, rl_steps[capacity]

  def advance(state):
    positions = np.atleast_1d(to_host(state.data_position)).tolist()
    started = time.perf_counter()
    collected = collect(policy_params(state), positions, axis.unstack(rollout_keys(state)),
                        run.task, config, samplers, axis, run.needs, run.sources)
    step = step_of(state) + 1
    if samples_out is not None and samples_due(config.train, step):
      samples_out.extend(train_samples(run.task, collected[0], run.spec.group_size, step,
                                       config.train.num_samples))
    for c in collected:  # before the update: a step mostly scored 0 must not train
      check_reward_error_fraction(c.reward_errors, c.scored,
                                  config.train.max_reward_error_fraction,
                                  step_of(state) + 1)
    rollout, inputs = axis.stack([c.rollout for c in collected]), axis.stack(
        [c.inputs for c in collected])
    if mesh is not None:
      rollout, inputs = shard_batch((rollout, inputs), mesh)
    capacity, rl_step = rl_step_for(rollout)
    collected_at = time.perf_counter()
    state, metrics = rl_step(state, rollout, inputs)
    metrics = to_host(metrics)  # waits for the step
    timings = dict(time_rollout_s=collected[0].rollout_s,
                   time_reward_s=collected_at - started - collected[0].rollout_s,
                   time_update_s=time.perf_counter() - collected_at)
    # Rollout tokens/s: every seed's sampled tokens over the sampler calls' wall time.
    rollout_speed = (sum(c.decoded_tokens for c in collected) /
                     max(collected[0].rollout_s, 1e-9))
    per_reward = (lambda c: {} if run.sources.only_rule else  # noqa: E731
                  {f"reward/{n}_mean": v for n, v in c.reward_means.items()})
    records = [step_record(m, rollout_metrics(c.inputs.rewards, c.rollout.completion_mask,
                                              c.rollout.truncated, run.spec.group_size),
                           config, c.sampling_rounds, c.groups_without_spread, c.reward_errors)
               | dict(decode_slot_utilisation=c.decoded_tokens / max(c.slot_steps, 1),
                      rollout_tokens_per_s=rollout_speed,
                      prompt_width=int(np.shape(c.rollout.prompt_tokens)[-1]))
               | ({} if capacity is None else {"packed_token_capacity": capacity})
               | per_reward(c) | timings
               for m, c in zip(axis.unstack(metrics), collected)]
    return state, [records], [sum(step_tokens(c.rollout) for c in collected)]

  return advance
