"""Collecting one step's experience on the host: prompts -> sampled groups -> rewards, with
DAPO's dynamic sampling (resample until every group has a reward spread) and ReMax's greedy
baseline rollout."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rewards.exact_match import exact_match_reward, token_step_rewards
from grpo_jax.rollout.sampler import Rollout
from grpo_jax.train.experience import RewardInputs


@dataclasses.dataclass
class Collected:
  rollout: Rollout  # B = num_prompts * G rows, groups contiguous
  inputs: RewardInputs
  prompts_consumed: int  # how far the data stream advanced
  sampling_rounds: int  # 1 + extra rounds drawn by dynamic sampling
  groups_without_spread: int  # groups kept although all their rewards were equal


def _score(task_targets, rollout: Rollout, group_size: int):
  repeat = lambda x: np.repeat(x, group_size, axis=0)  # noqa: E731
  tt, tm = repeat(task_targets.target_tokens), repeat(task_targets.target_mask)
  rewards = exact_match_reward(rollout.completion_tokens, rollout.completion_mask, tt, tm)
  steps = token_step_rewards(rollout.completion_tokens, rollout.completion_mask, tt, tm)
  return np.asarray(rewards), steps


def _rows(tree, rows):
  return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def collect(state, task, config, sample, greedy, key) -> Collected:
  """Samples config.rollout.num_prompts groups of G completions (see module docstring).

  sample(params, prompt_tokens, prompt_mask, key) and greedy(params, prompt_tokens,
  prompt_mask) are the jitted samplers.
  """
  r_cfg, rl = config.rollout, config.rl
  num_prompts, group = r_cfg.num_prompts, r_cfg.group_size
  position = int(state.data_position)
  kept, spare = [], []  # (rollout rows, rewards, steps, greedy rewards) per group
  rounds = 0
  while True:
    prompts = task.train_batch(position, num_prompts, config.seed)
    position += num_prompts
    repeat = lambda x: np.repeat(x, group, axis=0)  # noqa: E731
    rollout = sample(state.params, repeat(prompts.prompt_tokens), repeat(prompts.prompt_mask),
                     jax.random.fold_in(key, rounds))
    rounds += 1
    rewards, steps = _score(prompts, rollout, group)
    if rl.advantage == "remax":
      g = greedy(state.params, prompts.prompt_tokens, prompts.prompt_mask)
      greedy_rewards = np.repeat(np.asarray(exact_match_reward(
          g.completion_tokens, g.completion_mask, prompts.target_tokens,
          prompts.target_mask)), group)
    else:
      greedy_rewards = np.zeros_like(rewards)
    for g in range(num_prompts):
      rows = slice(g * group, (g + 1) * group)
      item = (_rows(rollout, rows), rewards[rows], _rows(steps, rows), greedy_rewards[rows])
      spread = rewards[rows].max() > rewards[rows].min()
      (kept if (spread or not rl.dynamic_sampling) else spare).append(item)
    if len(kept) >= num_prompts or not rl.dynamic_sampling or rounds > rl.max_extra_rollouts:
      break
  filler = max(num_prompts - len(kept), 0)
  chosen = kept[:num_prompts] + spare[:filler]
  cat = lambda xs: jax.tree.map(lambda *a: np.concatenate(a, 0), *xs)  # noqa: E731
  rollout = cat([c[0] for c in chosen])
  step_rewards, step_end, step_mask = cat([c[2] for c in chosen])
  inputs = RewardInputs(jnp.asarray(np.concatenate([c[1] for c in chosen])),
                        jnp.asarray(np.concatenate([c[3] for c in chosen])),
                        jnp.asarray(step_rewards), jnp.asarray(step_end),
                        jnp.asarray(step_mask))
  return Collected(Rollout(*map(jnp.asarray, rollout)), inputs,
                   position - int(state.data_position), rounds, filler)
