"""The whole RL iteration in one program: prompts from the task's deterministic stream,
sampling, reward, and the RL step, for a task whose stream and reward are JAX functions
(`Task.device_task`). `train.fused_steps = K` runs K iterations inside one lax.scan per host
call; with S seeds the scan is vmapped (or lax.mapped) over them: PureJaxRL's `vmap(train)`
for LLM RL, S seeds x K steps in one jitted program.

Iteration i of a seed is what the host path does for that seed at that step, on the devices:
the same prompts (the stream's rows [position, position + num_prompts)), the same rollout key
fold_in(rollout_key(source), 0), the same reward, the same `rl_step`. It is a source that owns
the step (train/sources/experience_source.py): the scan carries the whole RunState, the learner's
state and the source's. Host-only features are
refused up front by config validation (dynamic sampling; a host reward).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.parallel.distributed import to_host
from grpo_jax.rewards.estimator_inputs import DeviceRound, provide_device
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.sources.experience_source import register_experience_source, state_jit_options
from grpo_jax.train.run.metrics import rollout_metrics, step_record
from grpo_jax.train.learner.state import RunState, policy_params, rollout_key
from grpo_jax.train.learner.step import make_rl_step


def make_device_experience(run, device_task):
  """experience(state, source, table) -> (rollout, reward_inputs, DecodeStats): the host
  path's `collect` for one seed without dynamic sampling, on the devices; table is that seed's
  stream."""
  num_prompts, group = run.settings.num_prompts, run.settings.group_size
  sampling, grouped, needs = run.sampling, run.rollout, run.needs

  def experience(state, source, table):
    prompts = device_task.prompts(table, source.data_position, num_prompts)
    rollout, stats = grouped.with_stats(policy_params(state), prompts.prompt_tokens,
                                        prompts.prompt_mask,
                                        jax.random.fold_in(rollout_key(source), 0))
    tokens, mask = rollout.completion_tokens, rollout.completion_mask
    greedy = lambda: sampling.greedy()(policy_params(state), prompts.prompt_tokens,  # noqa
                                       prompts.prompt_mask, jax.random.key(0))
    extras = provide_device(needs, DeviceRound(device_task, prompts, tokens, mask, group,
                                               greedy))
    rewards = device_task.rewards(prompts, tokens, mask, group)
    return rollout, RewardInputs(rewards, extras, jnp.int32(num_prompts)), stats

  return experience


def make_fused_iteration(run, device_task):
  """iteration(run_state, table) -> (run_state, metrics): one whole RL step of one seed on
  device."""
  experience = make_device_experience(run, device_task)
  rl_step = make_rl_step(run.spec)
  group = run.settings.group_size

  def iteration(run_state, table):
    source = run_state.source
    rollout, inputs, stats = experience(run_state.train, source, table)
    state, metrics = rl_step(run_state.train, rollout, inputs)
    source = source.replace(data_position=source.data_position + inputs.prompts_consumed,
                            rollouts=source.rollouts + 1)
    metrics["rollout"] = rollout_metrics(inputs.rewards, rollout.completion_mask,
                                         rollout.truncated, group, xp=jnp)
    metrics["decode"] = (jnp.sum(rollout.completion_mask, dtype=jnp.int32), stats.slot_steps)
    metrics["step_tokens"] = (jnp.sum(rollout.prompt_mask) +
                              jnp.sum(rollout.completion_mask)).astype(jnp.int32)
    return RunState(state, source), metrics

  return iteration


def make_scanned_advance(run, state, iteration, table_of, record_of, samples_of=None):
  """advance(run_state) -> (run_state, records of K = max(train.fused_steps, 1) steps (each per
  seed), tokens of each step): K iterations of `iteration(run_state, table)` in one jitted
  lax.scan, transformed over the run's seeds (their stacked tables: table_of(seed, count), the
  stream up to the end of the run, placed on the devices once). record_of(metrics of one
  step of one seed, host arrays, its "step_tokens" and "samples" removed) -> that step's record;
  samples_of(the first seed's "samples" metrics of one step), in step order, if both given."""
  k = max(run.settings.fused_steps, 1)
  count = run.settings.steps * run.settings.num_prompts
  tables = run.axis.stack([jax.tree.map(jnp.asarray, table_of(s, count))
                           for s in run.axis.seeds])

  def k_steps(state, table):
    return jax.lax.scan(lambda s, _: iteration(s, table), state, None, length=k)

  fused = run.axis.compile(k_steps, **state_jit_options(state, run))

  def advance(state):
    state, metrics = fused(state, tables)
    per_seed = run.axis.unstack(to_host(metrics))  # each: leaves with a leading (K,) step axis
    records, tokens = [], []
    for i in range(k):
      step_records = []
      for j, m in enumerate(per_seed):
        one = jax.tree.map(lambda x: np.asarray(x)[i], m)
        one.pop("step_tokens")
        drawn = one.pop("samples", None)
        if j == 0 and drawn is not None and samples_of is not None:
          samples_of(drawn)
        step_records.append(record_of(one))
      records.append(step_records)
      tokens.append(sum(int(np.asarray(m["step_tokens"])[i]) for m in per_seed))
    return state, records, tokens

  return advance


@register_experience_source("fused", owns_step=True)
def make_fused_advance(run, state, samples_out=None):
  """The experience source "fused" (on-policy, owns the step): make_scanned_advance's advance.
  samples_out: unused (no text on the devices)."""
  settings = run.settings
  device_task = run.task.device_task()

  def record_of(one):
    stats = one.pop("rollout")
    decoded, slot_steps = one.pop("decode")
    return step_record(one, stats, settings.on_reward_error) | dict(
        decode_slot_utilisation=int(decoded) / max(int(slot_steps), 1))

  return make_scanned_advance(run, state, make_fused_iteration(run, device_task),
                              device_task.stream, record_of)
