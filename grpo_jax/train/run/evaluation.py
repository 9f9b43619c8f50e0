"""Held-out evaluation: greedy accuracy (the task's scores) and pass@k."""

from __future__ import annotations

import jax
import numpy as np

from grpo_jax.data.task import bucketed_width
from grpo_jax.models.config import ModelConfig
from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.mesh import shard_batch
from grpo_jax.prompt_batch import take_rows
from grpo_jax.rewards.guard import guarded_eval_scores, guarded_score
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.run.samples import describe
from grpo_jax.train.run.sections import EvalSection


def make_evaluator(task, model_cfg: ModelConfig, section: EvalSection, eval_keys: list, axis,
                   mesh=None):
  """evaluate(params) -> one metrics dict per seed of `axis` (a SeedAxis; params as it holds
  them): greedy accuracy on the first train.eval_size held-out prompts (the task's scores),
  and with train.eval_pass_k = k > 0 also pass@k, the fraction of prompts for which at least
  one of k completions sampled at the rollout temperature earns reward 1. Seed s samples with
  fold_in(eval_keys[s], chunk start)."""
  sampling = Sampling.of(model_cfg, task, section.rollout, mesh, task.max_new_tokens)
  place = ((lambda *xs: shard_batch(xs, mesh, replicate_indivisible=True))
           if mesh is not None else (lambda *xs: xs))
  placed = lambda im: None if im is None else place(im)[0]  # noqa: E731
  greedy = axis.compile(lambda p, t, m, im: sampling.greedy()(p, *place(t, m),
                                                              jax.random.key(0), placed(im)),
                        in_axes=(0, None, None, None))
  grouped = sampling.grouped(max(section.eval_pass_k, 1))
  sampled = axis.compile(lambda p, t, m, k, im: grouped(p, *place(t, m), k, placed(im)),
                         in_axes=(0, None, None, 0, None))

  def evaluate(params, samples_out=None, progress=None) -> list[dict]:
    def generate_fn(prompts, prompt_mask, chunk_start, is_sampled, images=None):
      if is_sampled:
        keys = axis.stack([jax.random.fold_in(k, chunk_start) for k in eval_keys])
        r = sampled(params, prompts, prompt_mask, keys, images)
      else:
        r = greedy(params, prompts, prompt_mask, images)
      r = to_host(r)
      return r if axis.stacked else jax.tree.map(lambda x: np.asarray(x)[None], r)
    return evaluate_models(generate_fn, len(axis), task, section, samples_out, progress)

  return evaluate


def evaluate(params, task, model_cfg: ModelConfig, section: EvalSection, key=None, mesh=None,
             samples_out=None, progress=None) -> dict:
  """make_evaluator's metrics of one policy (params of a single run); sample records appended
  to samples_out, progress(done, total) after each chunk of prompts."""
  from grpo_jax.train.run.seed_axis import SeedAxis  # noqa: PLC0415
  return evaluator_for(task)(task, model_cfg, section, [key], SeedAxis((0,)), mesh)(
      params, samples_out, progress)[0]


def evaluator_for(task):
  """make_evaluator, or make_episode_evaluator for a task of episodes (task.name="env")."""
  return (make_episode_evaluator if "episodes" in getattr(task, "capabilities", ())
          else make_evaluator)


def evaluate_models(generate_fn, num_models: int, task, section: EvalSection, samples_out=None,
                    progress=None) -> list[dict]:
  """`evaluate` for `num_models` policies at once (e.g. seeds stacked on a vmapped axis).

  generate_fn(prompt_tokens, prompt_mask, chunk_start, sampled) returns the host `Rollout` of
  every model, each array with a leading model axis: greedy completions, or (sampled=True)
  pass@k samples, k rows per prompt (each prompt prefilled once), drawn with each model's own
  evaluation key folded with chunk_start. Each chunk's prompts are cut to its longest prompt,
  rounded up to a multiple of section.prompt_bucket (0: not cut). With a list `samples_out`, each
  model's first train.num_samples greedy completions are appended to it as sample records
  (grpo_jax/train/run/samples.py; step -1, for the caller to set), one list per model. Scores go
  through train.on_reward_error as training rewards do (grpo_jax/rewards/guard.py): a
  non-finite one stops the run in one sentence, or scores 0 and is counted in
  eval_reward_errors; never a NaN in the figures.
  """
  batch = task.test_batch(section.eval_size)
  # (a task may hold fewer held-out rows and say so: data.fit_eval_size)
  size, chunk = min(section.eval_size, len(batch.prompt_tokens)), section.eval_batch_size
  pass_k, on_error = section.eval_pass_k, section.on_reward_error
  tokens, masks, passed = [], [], []
  for start in range(0, size, chunk):
    # Every chunk has the same static shape: the last one is padded with repeated rows.
    rows = np.minimum(np.arange(start, start + chunk), size - 1)
    keep = min(chunk, size - start)
    prompts, prompt_mask = batch.prompt_tokens[rows], batch.prompt_mask[rows]
    width = bucketed_width(prompt_mask, section.prompt_bucket)  # left padding cut
    prompts, prompt_mask = prompts[:, -width:], prompt_mask[:, -width:]
    # A vision task's rows carry their images (one per prompt): passed only when there are.
    images = getattr(batch, "pixel_values", None)
    images = () if images is None else (np.asarray(images)[rows],)
    r = generate_fn(prompts, prompt_mask, start, False, *images)
    tokens.append(np.asarray(r.completion_tokens)[:, :keep])
    masks.append(np.asarray(r.completion_mask)[:, :keep])
    if pass_k:
      s = generate_fn(prompts, prompt_mask, start, True, *images)  # pass_k rows per prompt
      chunk_rows = take_rows(batch, rows)
      passed.append(np.stack([
          (guarded_score(task, chunk_rows, s.completion_tokens[m], s.completion_mask[m],
                         pass_k, on_error)[0].reshape(chunk, pass_k) >= 1.0).any(1)[:keep]
          for m in range(num_models)]))
    if progress is not None:
      progress(start + keep, size)
  results = []
  for m in range(num_models):
    scores, failed = guarded_eval_scores(task, batch, np.concatenate([t[m] for t in tokens]),
                                         np.concatenate([k[m] for k in masks]), on_error)
    if failed.any():  # train.on_reward_error='zero': scored 0, counted
      scores["eval_reward_errors"] = failed.sum(keepdims=True).astype(np.float64)
    if pass_k:
      scores[f"eval_pass_at_{pass_k}"] = np.concatenate([p[m] for p in passed])
    results.append({name: float(np.mean(values)) for name, values in scores.items()})
  count = min(section.num_samples, size)
  if samples_out is not None and count:
    for m in range(num_models):
      tokens_m = np.concatenate([t[m] for t in tokens])[:count]
      mask_m = np.concatenate([k[m] for k in masks])[:count]
      rewards, _ = guarded_score(task, take_rows(batch, list(range(count))), tokens_m, mask_m,
                                 1, on_error)
      samples_out.append(describe(task, batch, range(count), tokens_m, mask_m, rewards, "eval",
                                  -1))
  return results


def make_episode_evaluator(task, model_cfg: ModelConfig, section: EvalSection, eval_keys: list,
                           axis, mesh=None):
  """make_evaluator for a task of episodes (task.name="env"): the first train.eval_size
  held-out rows played as greedy episodes, train.eval_batch_size at a time. eval_accuracy:
  the share of episodes rewarded 1; eval_reward: the mean reward; eval_turns_per_episode,
  eval_tool_calls_per_episode, ... (rollout/episodes/host.py `episode_metrics`). Samples are whole
  episodes, turn by turn. Stacked seeds (train.experience_source="fused_episodes") are
  played one after the other, one metrics record each."""
  del eval_keys  # greedy: no key is read
  from grpo_jax.rollout.episodes.host import (episode_metrics, episode_samples,  # noqa: PLC0415
                                      sample_episodes)
  greedy = Sampling.of(model_cfg, task, section.rollout, mesh).greedy()

  def evaluate(params, samples_out=None, progress=None) -> list[dict]:
    return [evaluate_one(p, samples_out, progress) for p in axis.unstack(params)]

  def evaluate_one(params, samples_out, progress) -> dict:
    batch = task.test_batch(section.eval_size)
    size, chunk = section.eval_size, section.eval_batch_size
    parts, infos = [], []
    for start in range(0, size, chunk):
      rows = batch.rows[start:start + chunk]
      rollout, got = sample_episodes(greedy, params, task.env, task.tokenizer, rows,
                                     list(range(start, start + len(rows))), jax.random.key(0),
                                     task.max_completion_tokens, prompt_width=task.prompt_len,
                                     kv_continuation=getattr(task, "kv_continuation", False),
                                     async_slots=getattr(task, "async_slots", 0))
      parts.append(rollout)
      infos += got
      if progress is not None:
        progress(start + len(rows), size)
    rollout = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
    rewards = np.asarray([i["reward"] for i in infos], np.float64)
    metrics = dict(eval_accuracy=float(np.mean(rewards >= 1.0)),
                   eval_reward=float(np.mean(rewards))) | episode_metrics(rollout, infos, "eval_")
    if samples_out is not None:
      samples_out.append(episode_samples(task.tokenizer, task.prompt_texts(batch), rollout,
                                         rewards, "eval", -1,
                                         range(min(section.num_samples, size))))
    return metrics

  return evaluate
