"""The episodes experience source ("episodes", on-policy): each call plays rollout.num_prompts
x rollout.group_size multi-turn episodes of the task's environment (task.name="env",
grpo_jax/data/env_task.py) with the current policy, as token ids (grpo_jax/rollout/episodes/host.py), and
hands them to the learner as one Rollout: the prompt, then every turn's ids, `action_mask` True
on the policy's sampled ids only, so the loss, the KL, the entropy and the importance weights
are the policy's (train/learner/experience.py). The reward is the environment's.

The G episodes of a prompt are rows [pG, (p + 1)G) of the batch; episode e of a step starting
at data position x has the id r = x G + e, its environment seed, and token t of its turn k is
drawn from (the step's rollout key, k, r, t) alone, whatever the tools' timing or the other
episodes of the batch.
"""

from __future__ import annotations

import time

import numpy as np

from grpo_jax.interrupts import interruptible
from grpo_jax.rollout.episodes.host import episode_metrics, episode_samples, sample_episodes
from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.mesh import shard_batch
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.learner.state import policy_params, rollout_key
from grpo_jax.train.run.checkpoint import step_of
from grpo_jax.train.run.metrics import rollout_metrics, step_tokens
from grpo_jax.train.run.samples import samples_due
from grpo_jax.train.sources.experience_source import Experience, Run, register_experience_source


@register_experience_source("episodes")
def make_episodes_source(run: Run, state, samples_out=None):
  """next_experience(train_state, source_state) -> (source_state, Experience): one step's
  episodes (see the module docstring). What it cannot run (a task without episodes, GFPO,
  dynamic sampling, stacked seeds) is refused before any compute: config_checks.py,
  rl_checks.check_seed_axis."""
  settings, task = run.settings, run.task
  group = settings.group_size
  seed = run.axis.seeds[0]
  turns = run.sampling.quantized(run.rollout.weight_dtype)  # one row per episode

  def next_experience(train_state, source):
    version = step_of(train_state)
    position = int(np.asarray(to_host(source.data_position)))
    prompts = task.train_rows(position, settings.num_prompts, seed)
    rows = [r for r in prompts for _ in range(group)]
    started = time.perf_counter()
    ids = [position * group + e for e in range(len(rows))]  # the stream's episode ids
    with interruptible():  # tools on the host: SIGTERM saves the last step at once
      rollout, infos = sample_episodes(
          turns, run.sync_weights(policy_params(train_state)), task.env, task.tokenizer,
          rows, ids, rollout_key(source), task.max_completion_tokens,
          prompt_width=task.prompt_len, episode_ids=ids,
          kv_continuation=getattr(task, "kv_continuation", False),
          async_slots=getattr(task, "async_slots", 0))
    elapsed = time.perf_counter() - started
    rewards = np.asarray([i["reward"] for i in infos], np.float32)
    if samples_out is not None and samples_due(settings, version + 1):
      firsts = list(range(0, min(settings.num_samples, settings.num_prompts) * group, group))
      texts = task.prompt_texts(task.prompt_batch(rows))
      samples_out.extend(episode_samples(task.tokenizer, texts, rollout, rewards, "train",
                                         version + 1, firsts))
    rollout = rollout._replace(version=np.full(len(rows), version, np.int32))
    inputs = RewardInputs(rewards, {}, np.int32(settings.num_prompts))
    tokens = step_tokens(rollout)
    record = (dict(rollout=rollout_metrics(rewards, rollout.completion_mask, rollout.truncated,
                                           group))
              | episode_metrics(rollout, infos)
              | dict(prompt_width=int(rollout.prompt_tokens.shape[1]), time_rollout_s=elapsed,
                     time_reward_s=0.0))  # (the environment scores inside the episodes)
    if run.mesh is not None:
      rollout, inputs = shard_batch((rollout, inputs), run.mesh)
    source = source.replace(data_position=source.data_position + settings.num_prompts,
                            rollouts=source.rollouts + 1)
    return source, Experience(rollout, inputs, [record], version, tokens)

  return next_experience
