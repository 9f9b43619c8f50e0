"""Supervised warm-up before RL or DPO (SFT on the task's own, deliberately noisy, answers, or on
a jsonl file of {prompt, response} given as warmup.data_path), and the SFT stage's step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax.data.supervised import SupervisedData, read_jsonl
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rl.losses import masked_mean
from grpo_jax.errors import RunStopped
from grpo_jax.train.learner.state import guarded_apply
from grpo_jax.train.run.resume_guards import file_fingerprints


def warmup_data(config, task):
  """What the warm-up learns from, as `warmup_batch(step, count, seed, carry_drop_fraction)`:
  the task, or with warmup.data_path its jsonl file of {prompt, response} tokenised by the
  task (data/supervised.py), read and checked here, before any compute (an InputError names
  the file and the line: a prompt past data.max_prompt_tokens among them)."""
  path = config.warmup.data_path
  if config.warmup.steps <= 0 or not path:
    return task
  records = read_jsonl(path, ("prompt", "response"), "warmup.data_path")
  return SupervisedData(task, records, config.rollout.max_new_tokens,
                        config.data.max_prompt_tokens)


def check_warmup_fits(data, model_cfg) -> None:
  """With a warmup.data_path file (`warmup_data`), an InputError naming its longest prompt's
  line when that prompt with rollout.max_new_tokens needs more positions than the model's
  max_position_embeddings (a vision-language policy's: its decoder's); once the model is built,
  before any step."""
  if isinstance(data, SupervisedData):
    data.check_fits_positions(getattr(model_cfg, "text", model_cfg).max_position_embeddings)


def warmup_files(config) -> dict:
  """The warm-up's data file's fingerprint for the run record ({} without one): a resume
  against a rewritten file is refused (train/run/resume_guards.py)."""
  if config.warmup.steps <= 0:
    return {}
  return file_fingerprints({"warmup.data_path": config.warmup.data_path})


def sft_loss(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask, target_tokens,
             target_mask, loss_mask=None):
  """Mean negative log-likelihood of the target tokens (answer and <eos>), or of those that
  `loss_mask` marks (the rest are context: an episode's environment tokens)."""
  logp, _ = completion_logprobs(params, model_cfg, prompt_tokens, prompt_mask, target_tokens,
                                target_mask)
  return -masked_mean(logp, target_mask if loss_mask is None else loss_mask)


def make_warmup_step(model_cfg: ModelConfig, warmup_cfg):
  """(optimizer, step): step(params, opt_state, prompt_tokens, prompt_mask, target_tokens,
  target_mask) -> (params, opt_state, loss, applied) is one un-jitted AdamW step of SFT (jit
  it, or vmap it over stacked seeds), guarded as every stage's update is (`guarded_apply`:
  a non-finite loss or gradient changes nothing; applied False). The RL run's warm-up and the
  SFT stage (grpo_jax/train/stages/supervised.py) take this one step."""
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, warmup_cfg.learning_rate, max(1, min(100, warmup_cfg.steps // 10)), warmup_cfg.steps + 1,
      end_value=warmup_cfg.learning_rate * 0.05)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))

  def step(params, opt_state, pt, pm, tt, tm, lm=None):
    loss, grads = jax.value_and_grad(sft_loss)(params, model_cfg, pt, pm, tt, tm, lm)
    params, opt_state, applied, _ = guarded_apply(params, opt_state, grads, loss, optimizer)
    return params, opt_state, loss, applied

  return optimizer, step


def warmup_log_due(i: int, total: int) -> bool:
  """Whether warm-up step i (0-based) prints a progress line (5 in all)."""
  return (i + 1) % max(total // 5, 1) == 0 or i + 1 == total


def run_warmup(params, data, model_cfg: ModelConfig, warmup_cfg, axis, log=print,
               stop=lambda: False, max_skips: int = 0):
  """`warmup_cfg.steps` AdamW steps of SFT for every seed of `axis` (a SeedAxis; params as it
  holds them), each on its own seed's batches of `data` (`warmup_data`: the task, or its
  warmup.data_path file); returns the new params (a pure function of the seed). Returns
  early, after the step in flight, once `stop()` is true (SIGTERM / SIGINT). With max_skips
  (train.max_consecutive_skips) > 0, RunStopped once a seed had that many updates in a row
  refused for a non-finite loss or gradient (counted on the device, read at each progress
  line and at the end)."""
  if warmup_cfg.steps <= 0:
    return params
  if hasattr(model_cfg, "text"):  # a vision-language policy: its decoder learns its own text
    text = run_warmup(params["text"], data, model_cfg.text, warmup_cfg, axis, log, stop,
                      max_skips)
    return {**params, "text": text}
  optimizer, step = make_warmup_step(model_cfg, warmup_cfg)
  step = axis.compile(step, donate_argnums=(0, 1))
  opt_state = axis.stack([optimizer.init(p) for p in axis.unstack(params)])
  params = jax.tree.map(jnp.copy, params)
  fields = ("prompt_tokens", "prompt_mask", "target_tokens", "target_mask")
  in_a_row = longest = jnp.zeros((len(axis.seeds),), jnp.int32)  # refused updates, per seed
  for i in range(warmup_cfg.steps):
    if stop():
      break
    batches = [data.warmup_batch(i, warmup_cfg.batch_size, s, warmup_cfg.carry_drop_fraction)
               for s in axis.seeds]
    if getattr(batches[0], "loss_mask", None) is not None:
      fields = fields[:4] + ("loss_mask",)
    params, opt_state, loss, applied = step(
        params, opt_state, *[axis.stack([getattr(b, f) for b in batches]) for f in fields])
    in_a_row = jnp.where(applied, 0, in_a_row + 1)
    longest = jnp.maximum(longest, in_a_row)
    if warmup_log_due(i, warmup_cfg.steps):
      losses = " ".join(f"{float(x):.4f}" for x in np.atleast_1d(np.asarray(loss)))
      log(f"warm-up {i + 1:>5}/{warmup_cfg.steps} | sft loss {losses}")
      _check_warmup_skips(int(longest.max()), max_skips, i + 1, warmup_cfg.steps)
  return params


def _check_warmup_skips(longest: int, limit: int, step: int, steps: int) -> None:
  if limit and longest >= limit:
    raise RunStopped(f"{longest} warm-up updates in a row were skipped for a non-finite loss or "
                     f"gradient (by warm-up step {step} of {steps}, train.max_consecutive_skips="
                     f"{limit}); lower warmup.learning_rate, check the warm-up's data "
                     f"(warmup.data_path), or raise train.max_consecutive_skips.")
