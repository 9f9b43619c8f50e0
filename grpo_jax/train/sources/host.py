"""The host experience source ("host"): each batch's prompts are sampled and scored on the host
(train/sources/collect.py: dynamic sampling, estimator inputs, reward sources); the learner
(train/stages/rl_advance.py) then runs the RL step on them.

rl.max_staleness = 0: on-policy, each call samples with the current policy. k > 0: the batches
of the next k steps are in the making while the learner updates (train/sources/pipeline.py:
device calls in the main thread in a fixed order, host rewards in producer threads), batch t
sampled by the policy of step max(0, t - k).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from grpo_jax.models.lora import LoraParams
from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.mesh import shard_batch
from grpo_jax.train.run.checkpoint import step_of
from grpo_jax.train.sources.collect import Samplers, collect
from grpo_jax.train.sources.experience_source import Experience, Run, register_experience_source
from grpo_jax.train.sources.pipeline import (Producer, Schedule, behaviour_version, copy_params,
                                              shift)
from grpo_jax.train.run.faults import check_reward_error_fraction
from grpo_jax.train.run.metrics import rollout_metrics, step_tokens
from grpo_jax.train.run.samples import samples_due, train_samples
from grpo_jax.train.learner.state import policy_params, rollout_key


@register_experience_source("host", pipelines=True)
def make_host_source(run: Run, state, samples_out=None):
  """next_experience(train_state, source_state) -> (source_state, Experience): the host path.
  On a step `samples_due`, the first seed's training samples are appended to samples_out."""
  settings, axis, mesh = run.settings, run.axis, run.sampler_mesh
  place = ((lambda *xs: shard_batch(xs, mesh, replicate_indivisible=True))
           if mesh is not None else (lambda *xs: xs))
  samplers = Samplers(
      sample=axis.compile(lambda p, t, m, k, *im: run.rollout.with_stats(
          p, *place(t, m), k, images=_placed(place, im))),
      greedy=axis.compile(lambda p, t, m, *im: run.sampling.greedy()(
          p, *place(t, m), jax.random.key(0), images=_placed(place, im))))
  rollout_keys = axis.compile(rollout_key)

  def produce(params, positions, keys, with_samplers=samplers):
    """The batch at data `positions` (per seed) sampled by `params` with rollout `keys`:
    (the seeds' Collected, its wall seconds)."""
    started = time.perf_counter()
    collected = collect(params, positions, keys, run.task, settings, with_samplers, axis,
                        run.needs, run.sources)
    return collected, time.perf_counter() - started

  def experience(collected, seconds, source, step: int, version: int):
    """The Experience of a collected batch learned at `step`, sampled by policy `version`, and
    the source state past it."""
    if samples_out is not None and samples_due(settings, step + 1):
      samples_out.extend(train_samples(run.task, collected[0], run.spec.group_size,
                                       step + 1, settings.num_samples))
    for c in collected:  # before the update: a step mostly scored 0 must not train
      check_reward_error_fraction(c.reward_errors, c.scored,
                                  settings.max_reward_error_fraction, step + 1)
    rollout = axis.stack([c.rollout._replace(version=np.full(
        np.shape(c.rollout.truncated), version, np.int32)) for c in collected])
    inputs = axis.stack([c.inputs for c in collected])
    consumed = axis.stack([np.int32(c.inputs.prompts_consumed) for c in collected])
    source = source.replace(data_position=source.data_position + consumed,
                            rollouts=source.rollouts + 1)
    if run.mesh is not None:
      rollout, inputs = shard_batch((rollout, inputs), run.mesh)
    reward_s = seconds - collected[0].rollout_s
    # Rollout tokens/s: every seed's sampled tokens over the sampler calls' wall time.
    rollout_speed = (sum(c.decoded_tokens for c in collected) /
                     max(collected[0].rollout_s, 1e-9))
    per_reward = (lambda c: {} if run.sources.only_rule else  # noqa: E731
                  {f"reward/{n}_mean": v for n, v in c.reward_means.items()})
    records = [dict(rollout=rollout_metrics(c.inputs.rewards, c.rollout.completion_mask,
                                            c.rollout.truncated, run.spec.group_size),
                    sampling_rounds=c.sampling_rounds,
                    groups_without_spread=c.groups_without_spread,
                    reward_errors=c.reward_errors,
                    decode_slot_utilisation=c.decoded_tokens / max(c.slot_steps, 1),
                    rollout_tokens_per_s=rollout_speed,
                    prompt_width=int(np.shape(c.rollout.prompt_tokens)[-1]))
               | per_reward(c) | dict(time_rollout_s=c.rollout_s, time_reward_s=reward_s)
               for c in collected]
    tokens = sum(step_tokens(c.rollout) for c in collected)
    return source, Experience(rollout, inputs, records, version, tokens)

  def positions_of(source) -> list:
    return np.atleast_1d(to_host(source.data_position)).tolist()

  if run.spec.rl.get("max_staleness", 0):
    return _pipelined(run, state, samplers, rollout_keys, produce, experience, positions_of)

  split = run.sampler_mesh is not run.mesh  # the sampler on devices of its own

  def next_experience(train_state, source):
    version = step_of(train_state)
    params, sync = run.sync_weights_timed(policy_params(train_state))
    collected, seconds = produce(params, positions_of(source), axis.unstack(rollout_keys(source)))
    source, exp = experience(collected, seconds, source, version, version)
    for record in exp.records if split else ():
      record.update(sync)
    return source, exp

  return next_experience


def _pipelined(run: Run, state, samplers, rollout_keys, produce, experience, positions_of):
  """next_experience for rl.max_staleness = k > 0 (train/sources/pipeline.py): batch t is
  sampled by the params of step max(0, t - k) while the learner applies the updates between."""
  k, axis, settings = run.spec.rl.max_staleness, run.axis, run.settings
  schedule = Schedule(k, settings.steps)
  # LoRA's frozen base, copied once: the learner's step donates the state that holds it.
  base = [None]

  def next_experience(train_state, source):
    step = step_of(train_state)
    if base[0] is None and train_state.base_params is not None:
      base[0] = copy_params(run.sync_weights(train_state.base_params))
    # Version `step` on the sampler's devices, in new buffers (the learner's step donates its own).
    current, sync = run.sync_weights_timed(train_state.params, copy=True)
    first = positions_of(source)

    def start(batch: int, params):
      offset = batch - step
      # Without dynamic sampling (refused with k > 0) each batch draws num_prompts prompts.
      positions = [p + offset * settings.num_prompts for p in first]
      keys = axis.unstack(rollout_keys(source.replace(rollouts=source.rollouts + offset)))
      weights = run.sync_weights(params if base[0] is None else LoraParams(base[0], params))
      return Producer(lambda lane: produce(weights, positions, keys, lane_samplers(lane, samplers)))

    (collected, seconds), waited = schedule.take(step, source.in_flight, current, start)
    source, exp = experience(collected, seconds, source, step, behaviour_version(step, k))
    source = source.replace(in_flight=shift(source.in_flight, current))
    for record in exp.records:
      record.update(sync, time_waiting_for_batch_s=waited)
    return source, exp

  return next_experience


def _placed(place, images: tuple):
  """The prompts' images (an optional trailing sampler argument) placed as the prompts are."""
  return place(*images)[0] if images else None


def lane_samplers(lane, samplers: Samplers) -> Samplers:
  """The samplers as a producer thread calls them: each call (and its copy to the host) run
  by the main thread when it serves the lane (train/sources/pipeline.py)."""
  return Samplers(sample=lane.wrap(lambda *a: to_host(samplers.sample(*a))),
                  greedy=lane.wrap(lambda *a: to_host(samplers.greedy(*a))))
