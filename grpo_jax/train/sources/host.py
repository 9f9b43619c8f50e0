"""The host experience source ("host", on-policy): each call samples the step's prompts with
the current policy and scores them on the host (train/sources/collect.py: dynamic sampling, estimator
inputs, reward sources); the learner (train/stages/rl_advance.py) then runs the RL step on them."""

from __future__ import annotations

import time

import jax
import numpy as np

from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.mesh import shard_batch
from grpo_jax.train.run.checkpoint import step_of
from grpo_jax.train.sources.collect import Samplers, collect
from grpo_jax.train.sources.experience_source import Experience, Run, register_experience_source
from grpo_jax.train.run.faults import check_reward_error_fraction
from grpo_jax.train.run.metrics import rollout_metrics, step_tokens
from grpo_jax.train.run.samples import samples_due, train_samples
from grpo_jax.train.learner.state import policy_params, rollout_key


@register_experience_source("host")
def make_host_source(run: Run, state, samples_out=None):
  """next_experience(train_state, source_state) -> (source_state, Experience): the host path.
  On a step `samples_due`, the first seed's training samples are appended to samples_out."""
  settings, axis, mesh = run.settings, run.axis, run.sampler_mesh
  place = ((lambda *xs: shard_batch(xs, mesh, replicate_indivisible=True))
           if mesh is not None else (lambda *xs: xs))
  samplers = Samplers(
      sample=axis.compile(lambda p, t, m, k: run.rollout.with_stats(p, *place(t, m), k)),
      greedy=axis.compile(lambda p, t, m: run.sampling.greedy()(p, *place(t, m),
                                                                jax.random.key(0))))
  rollout_keys = axis.compile(rollout_key)

  def next_experience(train_state, source):
    positions = np.atleast_1d(to_host(source.data_position)).tolist()
    version = step_of(train_state)
    started = time.perf_counter()
    collected = collect(run.sync_weights(policy_params(train_state)), positions,
                        axis.unstack(rollout_keys(source)), run.task, settings, samplers, axis,
                        run.needs, run.sources)
    if samples_out is not None and samples_due(settings, version + 1):
      samples_out.extend(train_samples(run.task, collected[0], run.spec.group_size,
                                       version + 1, settings.num_samples))
    for c in collected:  # before the update: a step mostly scored 0 must not train
      check_reward_error_fraction(c.reward_errors, c.scored,
                                  settings.max_reward_error_fraction, version + 1)
    rollout = axis.stack([c.rollout._replace(version=np.full(
        np.shape(c.rollout.truncated), version, np.int32)) for c in collected])
    inputs = axis.stack([c.inputs for c in collected])
    consumed = axis.stack([np.int32(c.inputs.prompts_consumed) for c in collected])
    source = source.replace(data_position=source.data_position + consumed,
                            rollouts=source.rollouts + 1)
    if run.mesh is not None:
      rollout, inputs = shard_batch((rollout, inputs), run.mesh)
    reward_s = time.perf_counter() - started - collected[0].rollout_s
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

  return next_experience
