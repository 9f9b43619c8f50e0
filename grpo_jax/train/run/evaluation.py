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


def make_evaluator(task, model_cfg: ModelConfig, train_cfg, rollout_cfg, eval_keys: list,
                   axis, mesh=None, prompt_bucket: int = 0):
  """evaluate(params) -> one metrics dict per seed of `axis` (a SeedAxis; params as it holds
  them): greedy accuracy on the first train.eval_size held-out prompts (the task's scores),
  and with train.eval_pass_k = k > 0 also pass@k, the fraction of prompts for which at least
  one of k completions sampled at the rollout temperature earns reward 1. Seed s samples with
  fold_in(eval_keys[s], chunk start)."""
  sampling = Sampling.of(model_cfg, task, rollout_cfg, mesh, task.max_new_tokens)
  place = ((lambda *xs: shard_batch(xs, mesh, replicate_indivisible=True))
           if mesh is not None else (lambda *xs: xs))
  greedy = axis.compile(lambda p, t, m: sampling.greedy()(p, *place(t, m), jax.random.key(0)),
                        in_axes=(0, None, None))
  grouped = sampling.grouped(max(train_cfg.eval_pass_k, 1))
  sampled = axis.compile(lambda p, t, m, k: grouped(p, *place(t, m), k),
                         in_axes=(0, None, None, 0))

  def evaluate(params, samples_out=None, progress=None) -> list[dict]:
    def generate_fn(prompts, prompt_mask, chunk_start, is_sampled):
      if is_sampled:
        keys = axis.stack([jax.random.fold_in(k, chunk_start) for k in eval_keys])
        r = sampled(params, prompts, prompt_mask, keys)
      else:
        r = greedy(params, prompts, prompt_mask)
      r = to_host(r)
      return r if axis.stacked else jax.tree.map(lambda x: np.asarray(x)[None], r)
    return evaluate_models(generate_fn, len(axis), task, train_cfg, prompt_bucket, samples_out,
                           progress)

  return evaluate


def evaluate(params, task, model_cfg: ModelConfig, train_cfg, rollout_cfg=None,
             key=None, mesh=None, prompt_bucket: int = 0, samples_out=None,
             progress=None) -> dict:
  """make_evaluator's metrics of one policy (params of a single run); sample records appended
  to samples_out, progress(done, total) after each chunk of prompts."""
  from grpo_jax.train.run.seed_axis import SeedAxis  # noqa: PLC0415
  return make_evaluator(task, model_cfg, train_cfg, rollout_cfg, [key], SeedAxis((0,)),
                        mesh, prompt_bucket)(params, samples_out, progress)[0]


def evaluate_models(generate_fn, num_models: int, task, train_cfg,
                    prompt_bucket: int = 0, samples_out=None, progress=None) -> list[dict]:
  """`evaluate` for `num_models` policies at once (e.g. seeds stacked on a vmapped axis).

  generate_fn(prompt_tokens, prompt_mask, chunk_start, sampled) returns the host `Rollout` of
  every model, each array with a leading model axis: greedy completions, or (sampled=True)
  pass@k samples, k rows per prompt (each prompt prefilled once), drawn with each model's own
  evaluation key folded with chunk_start. Each chunk's prompts are cut to its longest prompt,
  rounded up to a multiple of prompt_bucket (0: not cut). With a list `samples_out`, each
  model's first train.num_samples greedy completions are appended to it as sample records
  (grpo_jax/train/run/samples.py; step -1, for the caller to set), one list per model. Scores go
  through train.on_reward_error as training rewards do (grpo_jax/rewards/guard.py): a
  non-finite one stops the run in one sentence, or scores 0 and is counted in
  eval_reward_errors; never a NaN in the figures.
  """
  batch = task.test_batch(train_cfg.eval_size)
  size, chunk = train_cfg.eval_size, train_cfg.eval_batch_size
  pass_k, on_error = train_cfg.eval_pass_k, train_cfg.on_reward_error
  tokens, masks, passed = [], [], []
  for start in range(0, size, chunk):
    # Every chunk has the same static shape: the last one is padded with repeated rows.
    rows = np.minimum(np.arange(start, start + chunk), size - 1)
    keep = min(chunk, size - start)
    prompts, prompt_mask = batch.prompt_tokens[rows], batch.prompt_mask[rows]
    width = bucketed_width(prompt_mask, prompt_bucket)  # left padding cut (data.prompt_bucket)
    prompts, prompt_mask = prompts[:, -width:], prompt_mask[:, -width:]
    r = generate_fn(prompts, prompt_mask, start, False)
    tokens.append(np.asarray(r.completion_tokens)[:, :keep])
    masks.append(np.asarray(r.completion_mask)[:, :keep])
    if pass_k:
      s = generate_fn(prompts, prompt_mask, start, True)  # pass_k rows per prompt
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
  count = min(train_cfg.num_samples, size)
  if samples_out is not None and count:
    for m in range(num_models):
      tokens_m = np.concatenate([t[m] for t in tokens])[:count]
      mask_m = np.concatenate([k[m] for k in masks])[:count]
      rewards, _ = guarded_score(task, take_rows(batch, list(range(count))), tokens_m, mask_m,
                                 1, on_error)
      samples_out.append(describe(task, batch, range(count), tokens_m, mask_m, rewards, "eval",
                                  -1))
  return results
