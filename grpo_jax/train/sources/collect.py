"""Collecting one step's experience on the host, for every seed of the run at once: prompts ->
sampled groups -> rewards, with DAPO's dynamic sampling (resample until every group has a
reward spread) and only the estimator inputs that rl.advantage needs (ReMax's greedy
rewards, process supervision's step rewards).

Seed s's round k samples with key fold_in(rollout_key(source_s), k), whatever the other seeds
do: a seed whose batch is full sits out the remaining rounds (its rows in the stacked sampler
call are discarded), so each seed collects exactly what a run of it alone collects.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from grpo_jax.data.task import bucketed_width, cut_prompts
from grpo_jax.parallel.distributed import to_host
from grpo_jax.interrupts import interruptible
from grpo_jax.rewards.estimator_inputs import HostRound, provide_host, uses_greedy
from grpo_jax.rollout.types import Rollout
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.rewards.sources import RewardSources


@dataclasses.dataclass
class Collected:
  rollout: Rollout  # B = num_prompts * G rows, groups contiguous
  inputs: RewardInputs  # rewards, the estimator's extras, prompts consumed
  sampling_rounds: int  # 1 + extra rounds drawn by dynamic sampling
  groups_without_spread: int  # groups kept although all their rewards were equal
  reward_errors: int = 0  # completions scored 0 because their reward raised or was not finite
  scored: int = 0  # completions scored in every round (greedy ones included)
  decoded_tokens: int = 0  # completion tokens sampled in every round (kept or not)
  slot_steps: int = 0  # decode slots x loop iterations of those rounds (DecodeStats)
  rollout_s: float = 0.0  # wall time of the sampler calls it took part in (shared by seeds)
  # Each reward source's mean over the kept rows ({name: float}; reward/<name>_mean metrics).
  reward_means: dict = dataclasses.field(default_factory=dict)
  # Per kept group: (the task's prompt batch it was drawn in, its row there), for samples.
  group_prompts: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Samplers:
  """The jitted samplers of a run, both over the run's seed axis: sample(params, tokens, mask,
  keys[, images]) of the prompts (num_prompts, P) -> (a Rollout of num_prompts x G rows (each prompt
  prefilled once), its DecodeStats), and greedy(params, tokens, mask) -> one row per prompt."""
  sample: object
  greedy: object


def score_round(task, prompts, rollout: Rollout, greedy_rollout: Rollout | None,
                group_size: int, on_reward_error: str, needs=(), sources=None):
  """One sampling round scored on the host: (rewards (B,), extras, completions scored 0,
  {reward source: (B,) its values}, completions scored besides the round's). extras holds the
  estimator inputs `needs` names, each from its provider (grpo_jax/rewards/estimator_inputs.py).
  `sources` (grpo_jax/rewards/sources.py): the rewards and how they combine; None = the task's
  alone."""
  sources = sources or RewardSources()
  # Host waits (reward functions, servers, a teacher): SIGTERM saves the last step at once.
  with interruptible():
    rewards, failed, components = sources.score(task, prompts, rollout.completion_tokens,
                                                rollout.completion_mask, group_size,
                                                on_reward_error)
    errors = int(failed.sum())
    extras, rewards, failed, more_errors, scored = provide_host(needs, HostRound(
        task, prompts, rollout, group_size, on_reward_error, sources, rewards, failed,
        greedy_rollout))
  return rewards, extras, errors + more_errors, components, scored


def prompt_images(batches, axis) -> tuple:
  """(the seeds' stacked pixel_values,) of prompt batches with images (a vision task's
  `pixel_values`, one image per prompt), else (): the sampler's extra argument."""
  if getattr(batches[0], "pixel_values", None) is None:
    return ()
  return (axis.stack([np.asarray(b.pixel_values) for b in batches]),)


def _rows(tree, rows):
  return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def gfpo_rows(rl, rewards, completion_mask, group_size: int) -> np.ndarray:
  """The rows a step keeps: all of them, or with GFPO (rl.gfpo_keep = k > 0) the k of each
  group of G' = group_size with the best rl.gfpo_metric (grpo_jax/rl/gfpo.py), in row order.
  rl: the SourceSettings, or the config's rl section."""
  keep = rl.gfpo_keep
  if not keep:
    return np.arange(len(rewards))
  from grpo_jax.rl.gfpo import gfpo_keep_mask, gfpo_kept_rows  # noqa: PLC0415
  lengths = np.asarray(completion_mask).sum(1).astype(np.int32)
  mask = gfpo_keep_mask(rewards, lengths, group_size, keep, rl.gfpo_metric)
  return np.asarray(gfpo_kept_rows(mask, group_size, keep))


def collect(params, positions: list, keys: list, task, settings, samplers: Samplers, axis,
            needs=(), sources=None) -> list[Collected]:
  """settings.num_prompts groups of G completions for each seed of `axis` (see module
  docstring; with GFPO, the k kept of G' sampled); positions and keys are per seed (data
  positions, step keys); settings: the run's SourceSettings (experience_source.py); `sources`
  the rewards (score_round)."""
  num_prompts, sampled = settings.num_prompts, settings.group_size
  group = settings.update_group_size  # the k kept of G' with GFPO
  seeds = len(axis)
  kept, spare = [[] for _ in range(seeds)], [[] for _ in range(seeds)]
  position, rounds, errors = list(positions), [0] * seeds, [0] * seeds
  done, prompts = [False] * seeds, [None] * seeds
  decoded, slot_steps, rollout_s, scored = [0] * seeds, [0] * seeds, [0.0] * seeds, [0] * seeds
  while not all(done):
    for s in range(seeds):
      if not done[s]:
        prompts[s] = task.train_batch(position[s], num_prompts, axis.seeds[s])
    round_keys = axis.stack([jax.random.fold_in(k, rounds[s]) for s, k in enumerate(keys)])
    # Left padding cut to the longest prompt of the round, bucketed (data.prompt_bucket).
    width = max(bucketed_width(p.prompt_mask, settings.prompt_bucket) for p in prompts)
    cut = [cut_prompts(p, width) for p in prompts]
    start = time.perf_counter()
    images = prompt_images(cut, axis)
    batch = axis.stack([p.prompt_tokens for p in cut]), axis.stack([p.prompt_mask for p in cut])
    rollouts, stats = to_host(samplers.sample(params, *batch, round_keys, *images))
    elapsed = time.perf_counter() - start
    rollouts, stats = axis.unstack(rollouts), axis.unstack(stats)
    greedy = [None] * seeds
    if uses_greedy(needs):
      greedy = axis.unstack(to_host(samplers.greedy(params, *batch, *images)))
    for s in range(seeds):
      if done[s]:
        continue
      position[s] += num_prompts
      rounds[s] += 1
      decoded[s] += int(np.asarray(rollouts[s].completion_mask).sum())
      slot_steps[s] += int(np.asarray(stats[s].slot_steps))
      rollout_s[s] += elapsed
      rewards, extras, bad, parts, extra_scored = score_round(
          task, prompts[s], rollouts[s], greedy[s], sampled, settings.on_reward_error, needs,
          sources)
      errors[s] += bad
      scored[s] += len(rewards) + extra_scored
      kept_rows = gfpo_rows(settings, rewards, rollouts[s].completion_mask, sampled)
      for g in range(num_prompts):
        rows = kept_rows[g * group:(g + 1) * group]
        item = (_rows(rollouts[s], rows), rewards[rows], _rows(extras, rows),
                {n: v[rows] for n, v in parts.items()}, (prompts[s], g))
        spread = rewards[rows].max() > rewards[rows].min()
        (kept[s] if (spread or not settings.dynamic_sampling) else spare[s]).append(item)
      done[s] = (len(kept[s]) >= num_prompts or not settings.dynamic_sampling
                 or rounds[s] > settings.max_extra_rollouts)
  return [dataclasses.replace(
      _assemble(kept[s], spare[s], num_prompts, position[s] - positions[s], rounds[s],
                errors[s]), scored=scored[s], decoded_tokens=decoded[s],
      slot_steps=slot_steps[s], rollout_s=rollout_s[s]) for s in range(seeds)]


def _left_pad_prompts(rollout: Rollout, width: int) -> Rollout:
  """The rollout's prompts left-padded (mask False) to `width` columns: rounds of dynamic
  sampling may have cut their prompts to different widths. An MoE rollout's routes (B, P + N,
  layers, k) gain as many positions in front, 0 as for every token not run."""
  extra = width - rollout.prompt_tokens.shape[-1]
  if extra == 0:
    return rollout
  def pad(x):  # (id 0, mask False, expert 0) on the left of axis 1
    return np.pad(np.asarray(x), ((0, 0), (extra, 0)) + ((0, 0),) * (np.ndim(x) - 2))

  routes = None if rollout.routes is None else pad(rollout.routes)
  return rollout._replace(prompt_tokens=pad(rollout.prompt_tokens),
                          prompt_mask=pad(rollout.prompt_mask), routes=routes)


def _assemble(kept, spare, num_prompts, consumed, rounds, errors) -> Collected:
  filler = max(num_prompts - len(kept), 0)
  chosen = kept[:num_prompts] + spare[:filler]
  width = max(c[0].prompt_tokens.shape[-1] for c in chosen)
  chosen = [(_left_pad_prompts(c[0], width),) + tuple(c[1:]) for c in chosen]
  cat = lambda xs: jax.tree.map(lambda *a: np.concatenate(a, 0), *xs)  # noqa: E731
  inputs = RewardInputs(cat([c[1] for c in chosen]), cat([c[2] for c in chosen]),
                        np.int32(consumed))
  means = {n: float(np.mean(v)) for n, v in cat([c[3] for c in chosen]).items()}
  return Collected(cat([c[0] for c in chosen]), inputs, rounds, filler, errors,
                   reward_means=means, group_prompts=[c[4] for c in chosen])
