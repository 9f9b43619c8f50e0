"""The learner: the RL loop's `advance`. The run's experience source produces an Experience;
the learner checks its staleness and applies the one jitted RL step (grpo_jax/train/learner/step.py,
state donated) to it:

    source -> Experience -> learner (rl_step) -> RunState -> checkpoint

A source that owns the step (the fused one) hands back its own advance instead.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from grpo_jax.config import ConfigError
from grpo_jax.models.packing import token_capacity
from grpo_jax.parallel.distributed import to_host
from grpo_jax.train.run.checkpoint import step_of
from grpo_jax.train.sources.experience_source import (EXPERIENCE_SOURCES, Run,
                                                      state_jit_options)
from grpo_jax.train.run.metrics import step_record
from grpo_jax.train.learner.state import RunState
from grpo_jax.train.learner.step import make_rl_step


def learner_record(step_metrics: dict, source_record: dict, on_reward_error: str) -> dict:
  """One step's record: the RL step's metrics, the rollout's (step_record), then the rest of
  what the source measured, in its order."""
  rest = dict(source_record)
  record = step_record(step_metrics, rest.pop("rollout"), on_reward_error,
                       rest.pop("sampling_rounds", 1), rest.pop("groups_without_spread", 0),
                       rest.pop("reward_errors", 0))
  return record | rest


def check_staleness(version: int, step: int, max_staleness: int, name: str) -> None:
  """Rows sampled by policy `version` may train the learner at `step` only within the
  source's declared staleness."""
  if step - version > max_staleness or version > step:
    raise ConfigError(
        f"train.experience_source={name!r} produced rows of policy version {version} for the "
        f"learner at step {step}, {step - version} updates apart, outside the source's "
        f"declared max_staleness={max_staleness}; register the source with the staleness it "
        f"produces.")


def make_advance(run: Run, state: RunState, samples_out=None):
  """advance(run_state) -> (run_state, [per-seed records of the step], [its tokens])."""
  axis, rl, name = run.axis, run.spec.rl, run.settings.name
  source = EXPERIENCE_SOURCES.get(name)
  staleness = source.staleness(rl)
  made = source.make(run, state, samples_out)
  if source.owns_step:
    return made
  rl_steps = {}  # token capacity (None: unpacked) -> the RL step compiled for it

  def rl_step_for(rollout):
    """The jitted RL step for this rollout: with rl.pack_tokens, the one of its packed token
    capacity (models/packing.py: at most rl.pack_tokens of them over a run)."""
    capacity = None
    if rl.pack_tokens:
      rows, width = np.shape(rollout.completion_mask)[-2:]
      lengths = np.sum(to_host(rollout.completion_mask), axis=-1)
      capacity = token_capacity(lengths, rows // (rl.num_minibatches * rl.num_micro_batches),
                                width - 1, rl.pack_tokens)
    if capacity not in rl_steps:
      spec = dataclasses.replace(run.spec, token_capacity=capacity)
      rl_steps[capacity] = axis.compile(make_rl_step(spec),
                                        **state_jit_options(state.train, run))
    return capacity, rl_steps[capacity]

  def advance(state: RunState):
    source_state, experience = made(state.train, state.source)
    step = step_of(state)  # (read before the step donates the state)
    check_staleness(experience.version, step, staleness, name)
    capacity, rl_step = rl_step_for(experience.rollout)
    started = time.perf_counter()
    train, metrics = rl_step(state.train, experience.rollout, experience.reward_inputs)
    metrics = to_host(metrics)  # waits for the step
    update_s = time.perf_counter() - started
    packed = {} if capacity is None else {"packed_token_capacity": capacity}
    stale = {} if not staleness else {"experience_staleness": step - experience.version}
    records = [learner_record(m, r, run.settings.on_reward_error) | packed | stale | dict(time_update_s=update_s)
               for m, r in zip(axis.unstack(metrics), experience.records)]
    return RunState(train, source_state), [records], [experience.tokens]

  def first_rewards(state: RunState) -> list:
    """The rewards of the batch that advance(state) will learn from, drawn and scored now
    without advancing anything (the source's state is a value; advance draws the same batch
    again): per seed, an array of the batch's rows."""
    _, experience = made(state.train, state.source)
    if samples_out is not None:
      samples_out.clear()
    return [np.asarray(r) for r in axis.unstack(to_host(experience.reward_inputs.rewards))]

  # (not for a source that runs ahead of the learner: drawing would start its pipeline)
  advance.first_rewards = None if staleness else first_rewards
  return advance
