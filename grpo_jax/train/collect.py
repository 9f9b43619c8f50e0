"""Collecting one step's experience on the host: prompts -> sampled groups -> rewards, with
DAPO's dynamic sampling (resample until every group has a reward spread) and ReMax's greedy
baseline rollout."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from grpo_jax.parallel.distributed import to_host
from grpo_jax.rollout.sampler import Rollout
from grpo_jax.train.experience import RewardInputs
from grpo_jax.train.faults import guarded_score


@dataclasses.dataclass
class Collected:
  rollout: Rollout  # B = num_prompts * G rows, groups contiguous
  inputs: RewardInputs
  prompts_consumed: int  # how far the data stream advanced
  sampling_rounds: int  # 1 + extra rounds drawn by dynamic sampling
  groups_without_spread: int  # groups kept although all their rewards were equal
  reward_errors: int = 0  # completions scored 0 because their reward raised or was not finite


def _score(task, prompts, rollout: Rollout, group_size: int, on_error: str):
  """Rewards (B,), step rewards (three (B, K) arrays; zeros if the task has none) and the
  number of completions scored 0 for a failing reward (see faults.guarded_score)."""
  rewards, steps, errors = guarded_score(task, prompts, rollout.completion_tokens,
                                         rollout.completion_mask, group_size, on_error)
  if steps is None:
    mask = np.asarray(rollout.completion_mask)
    steps = (np.zeros(mask.shape, np.float32), np.zeros(mask.shape, np.int32),
             np.zeros(mask.shape, bool))
  return np.asarray(rewards, np.float32), steps, errors


def _rows(tree, rows):
  return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def score_round(task, prompts, rollout: Rollout, greedy_rollout: Rollout | None,
                group_size: int, on_reward_error: str) -> Collected:
  """One sampling round scored on the host: rewards of every row and, for ReMax, of the
  greedy completion of each prompt (repeated over its group); no resampling."""
  rewards, steps, errors = _score(task, prompts, rollout, group_size, on_reward_error)
  if greedy_rollout is not None:
    greedy_rewards, _, bad = _score(task, prompts, greedy_rollout, 1, on_reward_error)
    greedy_rewards, errors = np.repeat(greedy_rewards, group_size), errors + bad
  else:
    greedy_rewards = np.zeros_like(rewards)
  inputs = RewardInputs(rewards, greedy_rewards, *steps)
  return Collected(rollout, inputs, len(prompts.prompt_tokens), 1, 0, errors)


def collect(state, task, config, sample, greedy, key, on_reward_error="raise") -> Collected:
  """Samples config.rollout.num_prompts groups of G completions (see module docstring).

  sample(params, prompt_tokens, prompt_mask, key) and greedy(params, prompt_tokens,
  prompt_mask) are the jitted samplers; on_reward_error is train.on_reward_error.
  """
  r_cfg, rl = config.rollout, config.rl
  num_prompts, group = r_cfg.num_prompts, r_cfg.group_size
  start = position = int(to_host(state.data_position))
  kept, spare = [], []  # (rollout rows, reward inputs rows) per group
  rounds = errors = 0
  while True:
    prompts = task.train_batch(position, num_prompts, config.seed)
    position += num_prompts
    repeat = lambda x: np.repeat(x, group, axis=0)  # noqa: E731
    rollout = sample(state.params, repeat(prompts.prompt_tokens), repeat(prompts.prompt_mask),
                     jax.random.fold_in(key, rounds))
    rounds += 1
    greedy_rollout = None
    if rl.advantage == "remax":
      greedy_rollout = to_host(greedy(state.params, prompts.prompt_tokens, prompts.prompt_mask))
    scored = score_round(task, prompts, to_host(rollout), greedy_rollout, group,
                         on_reward_error)
    errors += scored.reward_errors
    for g in range(num_prompts):
      rows = slice(g * group, (g + 1) * group)
      item = (_rows(scored.rollout, rows), _rows(scored.inputs, rows))
      spread = scored.inputs.rewards[rows].max() > scored.inputs.rewards[rows].min()
      (kept if (spread or not rl.dynamic_sampling) else spare).append(item)
    if len(kept) >= num_prompts or not rl.dynamic_sampling or rounds > rl.max_extra_rollouts:
      break
  filler = max(num_prompts - len(kept), 0)
  chosen = kept[:num_prompts] + spare[:filler]
  cat = lambda xs: jax.tree.map(lambda *a: np.concatenate(a, 0), *xs)  # noqa: E731
  return Collected(cat([c[0] for c in chosen]), cat([c[1] for c in chosen]), position - start,
                   rounds, filler, errors)
