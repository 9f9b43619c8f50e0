"""Preference optimisation as a stage (python -m grpo_jax.train_dpo --config=... --workdir=W;
README "DPO and its family"): a loss of grpo_jax/rl/dpo.py on {prompt, chosen, rejected} pairs.

  start      the SFT policy: model.path, then the task's warm-up when warmup.steps > 0 (so one
             command goes from a random model to DPO on the tiny task); it is also the frozen
             reference (state.ref_params), kept in every checkpoint.
  pairs      dpo.train_path / test_path (jsonl), or made from the task as the reward model's
             are (stages.preference_pairs): a share dpo.policy_fraction from the start's own
             wrong samples, the rest synthetic.
  rounds     dpo.rounds = R > 0: Iterative RPO (Pang et al. 2024) instead: R rounds of
             dpo.steps steps, each on pairs of the round's start policy's own samples
             (`self_pairs`: rollout.group_size samples of each of dpo.round_prompts fresh
             training prompts, a correct one (the task's full reward) against a wrong one, up to
             dpo.pairs_per_prompt per prompt), each round's reference the policy at its start
             (the last round's result). The held-out pairs are then synthetic only, and their
             implicit rewards are measured against the current round's reference.
  reference  the reference's summed log-probs of every training pair computed once before the
             first step (dpo.reference="cached") or at each step ("on_the_fly"); none for a
             reference-free loss (simpo, orpo); KTO's z0 on the batch's mismatched pairs.
  metrics    at every step: loss, implicit rewards of the chosen and the rejected completions
             (β log π/π_ref), their margin, pair accuracy, log-probs; at step 0, every
             dpo.eval_every steps and at the end: held-out greedy accuracy (the task's
             evaluation, eval_accuracy) and, on the held-out pairs, the same reward metrics
             (eval_pair_accuracy, eval_reward_margin, ...).
  the rest   the checkpoints, SIGTERM / SIGINT and exact resume of every stage (run_stage);
             the policy exported to W/hf_export.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.data.supervised import PairData, epoch_positions
from grpo_jax.errors import ConfigError
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.parallel.platform import start_backend
from grpo_jax.rl.dpo import PREFERENCE_LOSSES, PairLogps, implicit_rewards, kto_reference_point
from grpo_jax.train import files
from grpo_jax.train.evaluation import make_evaluator
from grpo_jax.train.runner import Schedule
from grpo_jax.train.seed_axis import SeedAxis
from grpo_jax.train.setup import build_model, build_task, check_task_fits_model
from grpo_jax.train.stages import (check_pair_sources, export_model_type, preference_pairs,
                                   run_stage)
from grpo_jax.train.state import apply_if_finite, create_train_state, make_optimizer
from grpo_jax.train.warmup import run_warmup
from grpo_jax.train.workdir import WorkdirLock, check_workdir

REFERENCES = ("cached", "on_the_fly")


def check_dpo_config(config) -> None:
  """dpo.* sizes and choices, in one sentence each, before any compute."""
  d = config.dpo
  for name in ("steps", "batch_size", "eval_every", "train_pairs", "test_pairs"):
    if d[name] < 1:
      raise ConfigError(f"dpo.{name}={d[name]}; use at least 1.")
  if d.rounds < 0 or (d.rounds > 0 and (d.round_prompts < 1 or d.pairs_per_prompt < 1)):
    raise ConfigError(f"dpo.rounds={d.rounds}, dpo.round_prompts={d.round_prompts}, "
                      f"dpo.pairs_per_prompt={d.pairs_per_prompt}; use rounds 0 (offline pairs) "
                      f"or rounds >= 1 with round_prompts and pairs_per_prompt >= 1.")
  if d.reference not in REFERENCES:
    raise ConfigError(f"dpo.reference={d.reference!r}; use one of {', '.join(REFERENCES)}.")
  PREFERENCE_LOSSES.bind(d.loss, d)  # an unknown loss or a bad hyperparameter
  check_pair_sources(config, "dpo")


def pair_sums(params, model_cfg, prompt_tokens, prompt_mask, tokens, mask):
  """Summed log-probs of each row's completion tokens. (B,)"""
  logp, _ = completion_logprobs(params, model_cfg, prompt_tokens, prompt_mask, tokens, mask)
  return logp.sum(1)


def chosen_and_rejected(params, model_cfg, b):
  """(chosen sums, rejected sums) of a PairBatch in one pass over its 2B rows."""
  twice = lambda x: jnp.concatenate([x, x])  # noqa: E731
  sums = pair_sums(params, model_cfg, twice(b.prompt_tokens), twice(b.prompt_mask),
                   jnp.concatenate([b.chosen_tokens, b.rejected_tokens]),
                   jnp.concatenate([b.chosen_mask, b.rejected_mask]))
  n = b.prompt_tokens.shape[0]
  return sums[:n], sums[n:]


def make_pair_logps(model_cfg, loss_name: str):
  """pair_logps(params, ref_params, batch, ref) -> PairLogps: the policy's sums, the
  reference's (`ref`, the cached pair, or computed from ref_params without gradient when ref is
  None; none for a reference-free loss) and KTO's z0 (prompt i with the chosen completion of
  row i - 1)."""
  entry = PREFERENCE_LOSSES.get(loss_name)
  reference_free = getattr(entry, "reference_free", False)
  needs_kl = getattr(entry, "needs_kl", False)

  def pair_logps(params, ref_params, b, ref=None):
    chosen, rejected = chosen_and_rejected(params, model_cfg, b)
    if not reference_free and ref is None:
      ref = jax.lax.stop_gradient(chosen_and_rejected(ref_params, model_cfg, b))
    kl = None
    if needs_kl:
      shifted = (jnp.roll(b.chosen_tokens, 1, 0), jnp.roll(b.chosen_mask, 1, 0))
      kl = kto_reference_point(
          jax.lax.stop_gradient(pair_sums(params, model_cfg, b.prompt_tokens, b.prompt_mask,
                                          *shifted)),
          pair_sums(ref_params, model_cfg, b.prompt_tokens, b.prompt_mask, *shifted))
    ref_chosen, ref_rejected = (None, None) if reference_free else ref
    return PairLogps(chosen, rejected, b.chosen_mask.sum(1).astype(jnp.float32),
                     b.rejected_mask.sum(1).astype(jnp.float32), ref_chosen, ref_rejected, kl)

  return pair_logps, reference_free


def reward_metrics(p: PairLogps, beta: float, reference_free: bool, prefix: str = "") -> dict:
  """Mean implicit rewards of the chosen and rejected completions, their margin, the share of
  pairs ordered right (a tie counts as wrong) and the mean summed log-probs."""
  chosen, rejected = implicit_rewards(p, beta, reference_free)
  return {f"{prefix}rewards_chosen": jnp.mean(chosen),
          f"{prefix}rewards_rejected": jnp.mean(rejected),
          f"{prefix}reward_margin": jnp.mean(chosen - rejected),
          f"{prefix}pair_accuracy": jnp.mean((chosen > rejected).astype(jnp.float32)),
          f"{prefix}logps_chosen": jnp.mean(p.chosen),
          f"{prefix}logps_rejected": jnp.mean(p.rejected)}


def make_dpo_step(model_cfg, optimizer, section):
  """step(state, batch, ref) -> (state, metrics): one AdamW step of section.loss (not applied
  when the loss or a gradient is not finite); ref: the batch's cached reference sums or None."""
  loss_fn = PREFERENCE_LOSSES.bind(section.loss, section)
  pair_logps, reference_free = make_pair_logps(model_cfg, section.loss)
  beta = float(section.beta)

  def step(state, b, ref):
    def objective(params):
      p = pair_logps(params, state.ref_params, b, ref)
      return loss_fn(p), p

    (loss, p), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    (params, _), opt_state, applied = apply_if_finite(
        (state.params, None), state.opt_state, (grads, None), loss, optimizer)
    state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                          data_position=state.data_position + b.prompt_tokens.shape[0],
                          skipped_updates=state.skipped_updates + (~applied).astype(jnp.int32))
    metrics = dict(loss=loss, **reward_metrics(p, beta, reference_free))
    if p.kl is not None:
      metrics["kl"] = p.kl
    return state, metrics

  return step


def cache_reference(model_cfg, ref_params, data: PairData, batch_size: int):
  """The reference's (chosen, rejected) sums of every pair of `data`, in pair order."""
  run = jax.jit(functools.partial(chosen_and_rejected, model_cfg=model_cfg))
  chosen, rejected = np.zeros(len(data), np.float32), np.zeros(len(data), np.float32)
  for start in range(0, len(data), batch_size):
    rows = np.arange(start, min(start + batch_size, len(data)))
    padded = np.concatenate([rows, np.zeros(batch_size - len(rows), int)])  # one shape
    c, r = run(ref_params, b=data.batch(padded))
    chosen[rows], rejected[rows] = np.asarray(c)[:len(rows)], np.asarray(r)[:len(rows)]
  return chosen, rejected


def evaluate_pairs(pair_logps, reference_free, beta, state, data: PairData,
                   batch_size: int) -> dict:
  """The reward metrics (eval_ prefixed) over every held-out pair once."""
  parts = []
  for start in range(0, len(data), batch_size):
    rows = np.arange(start, min(start + batch_size, len(data)))
    padded = np.concatenate([rows, np.zeros(batch_size - len(rows), int)])
    p = pair_logps(state.params, state.ref_params, data.batch(padded))
    parts.append(jax.tree.map(lambda x: np.asarray(x)[:len(rows)] if np.ndim(x) else x, p))
  joined = PairLogps(*[None if parts[0][i] is None or not np.ndim(parts[0][i])
                       else np.concatenate([q[i] for q in parts]) for i in range(len(parts[0]))])
  return {k: float(v) for k, v in reward_metrics(joined, beta, reference_free, "eval_").items()}


def self_pairs(config, task, sample, params, round_index: int) -> list[dict]:
  """Round `round_index`'s pairs {prompt, chosen: a correct sample, rejected: a wrong one} of
  `params` on dpo.round_prompts training prompts (the stream's slice for that round, so each
  round meets new problems), `sample` = the jitted grouped sampler; a pure function of the seed,
  the round and params. Per prompt the i-th distinct correct text meets the i-th distinct wrong
  one, up to dpo.pairs_per_prompt pairs; a prompt with no correct or no wrong sample makes none."""
  d, group, seed = config.dpo, config.rollout.group_size, int(config.seed)
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 8), round_index)
  decode = task.tokenizer.decode
  text = lambda t, m: decode(t[np.asarray(m, bool)])  # noqa: E731
  pairs, batch = [], min(256, d.round_prompts)
  for done in range(0, d.round_prompts, batch):
    count = min(batch, d.round_prompts - done)
    prompts = task.train_batch(round_index * d.round_prompts + done, count, seed + 5)
    rollout = sample(params, prompts.prompt_tokens, prompts.prompt_mask,
                     jax.random.fold_in(key, done))
    tokens, mask = np.asarray(rollout.completion_tokens), np.asarray(rollout.completion_mask)
    right = task.score(prompts, tokens, mask, group) >= 1.0
    for p in range(count):
      rows = range(p * group, (p + 1) * group)
      good = list(dict.fromkeys(text(tokens[r], mask[r]) for r in rows if right[r]))
      bad = list(dict.fromkeys(text(tokens[r], mask[r]) for r in rows if not right[r]))
      prompt = text(prompts.prompt_tokens[p], prompts.prompt_mask[p])
      pairs += [{"prompt": prompt, "chosen": c, "rejected": r}
                for c, r in list(zip(good, bad))[:d.pairs_per_prompt]]
  return pairs


def train_dpo(config, workdir: str, log=print):
  """The preference-optimisation stage (module docstring); resumes from the newest
  checkpoint. Returns the last state."""
  config_lib.validate(config)
  check_workdir(workdir)
  check_dpo_config(config)
  start_backend(config.train.compilation_cache)
  d = config.dpo
  task = build_task(config, log)
  key = jax.random.key(config.seed)
  model_cfg, params = build_model(config, jax.random.fold_in(key, 0))
  check_task_fits_model(config, model_cfg, task)
  seed, axis = int(config.seed), SeedAxis((int(config.seed),))
  rounds = int(d.rounds)
  total = d.steps * max(rounds, 1)
  optimizer = make_optimizer(config.optim, total)

  def state_from(start):
    return create_train_state(start, optimizer, jax.random.fold_in(key, 1)).replace(
        ref_params=jax.tree.map(jnp.copy, start))

  def fresh():
    return state_from(run_warmup(params, task, model_cfg, config.warmup, axis, log))

  step_fn = jax.jit(make_dpo_step(model_cfg, optimizer, d), donate_argnums=0)
  pair_logps, reference_free = make_pair_logps(model_cfg, d.loss)
  pair_logps = jax.jit(pair_logps)
  evaluate_policy = make_evaluator(task, model_cfg, config.train, config.rollout,
                                   [jax.random.fold_in(key, 3)], axis)
  data = {}  # the pairs (and cached reference sums), made from the start on first use
  n = config.rollout.max_new_tokens
  sample = None
  if rounds > 0:
    from grpo_jax.rollout.sampler import Sampling  # noqa: PLC0415
    sample = jax.jit(Sampling.of(model_cfg, task, config.rollout).grouped(
        config.rollout.group_size))

  def held_out(state) -> PairData:
    """The held-out pairs, made once: a share from the start's own wrong samples offline
    (state.ref_params is the start throughout), only synthetic ones with rounds (whose
    reference moves), so that a resumed run makes the same."""
    if "test" not in data:
      start = (model_cfg, state.ref_params) if rounds == 0 else None
      data["test"] = PairData(task, preference_pairs(config, "dpo", task, "test", start), n)
    return data["test"]

  def prepared(state) -> dict:
    """The current round's training pairs (round 0 without rounds), from state.ref_params."""
    start = (model_cfg, state.ref_params)
    held_out(state)
    r = int(state.step) // d.steps if rounds > 0 else 0
    if data.get("round") != r:
      if rounds > 0:
        made = self_pairs(config, task, sample, state.ref_params, r)
        if not made:
          raise ConfigError(f"dpo round {r}: the policy's samples of {d.round_prompts} prompts "
                            f"held no correct-wrong pair; raise dpo.round_prompts or "
                            f"rollout.group_size, or the rollout temperature.")
        log(f"dpo: round {r + 1}/{rounds}: {len(made)} pairs of the policy's own correct and "
            f"wrong samples ({d.round_prompts} prompts x {config.rollout.group_size})")
      else:
        made = preference_pairs(config, "dpo", task, "train", start)
        log(f"dpo: {len(made)} training pairs, {len(data['test'])} held-out pairs, loss {d.loss}")
      data.update(round=r, train=PairData(task, made, n))
      data.pop("ref", None)
      if d.reference == "cached" and not reference_free:
        data["ref"] = cache_reference(model_cfg, state.ref_params, data["train"], d.batch_size)
    return data

  def advance(state):
    if rounds > 0 and int(state.step) % d.steps == 0 and int(state.step) > 0:
      # A new round: its reference is the policy now (the last round's result).
      state = state.replace(ref_params=jax.tree.map(jnp.copy, state.params))
    pairs = prepared(state)
    step = int(state.step)
    position = int(state.data_position) if rounds == 0 else (step % d.steps) * d.batch_size
    rows = epoch_positions(position, d.batch_size, len(pairs["train"]), seed)
    ref = tuple(x[rows] for x in pairs["ref"]) if "ref" in pairs else None
    state, metrics = step_fn(state, pairs["train"].batch(rows), ref)
    return state, [[{k: float(v) for k, v in metrics.items()}]], None

  def evaluate(state, step):
    scores = evaluate_policy(state.params)[0]
    return [{**scores, **evaluate_pairs(pair_logps, reference_free, float(d.beta), state,
                                        held_out(state), d.batch_size)}]

  def write(writer, state, first, records, tokens, seconds, clock):
    record = records[-1][0]
    if "eval_accuracy" in record:  # step 0 (the start) and every evaluation after it
      loss = f" | loss {record['loss']:.4f}" if "loss" in record else " (the start)"
      log(f"dpo step {first:>5}/{total}{loss} | held-out accuracy "
          f"{record['eval_accuracy']:.3f} | held-out pair accuracy "
          f"{record['eval_pair_accuracy']:.3f} | margin {record['eval_reward_margin']:.3f}")
    writer.write(first, record)

  with WorkdirLock(workdir):
    state = run_stage("dpo", config, workdir, fresh, advance, evaluate, write,
                      Schedule(total, d.eval_every, config.train.checkpoint_every), log,
                      free=("dpo.eval_every", "dpo.export") + (("dpo.steps",) if rounds == 0
                                                               else ("dpo.rounds",)),
                      fresh_shape=lambda: state_from(params))
    if d.export:
      from grpo_jax.models.hf_export import export_hf_checkpoint  # noqa: PLC0415
      out = os.path.join(workdir, "hf_export")
      with files.local_folder(out) as folder:
        export_hf_checkpoint(state.params, model_cfg, folder, config.model.path or None,
                             export_model_type(config, model_cfg))
      log(f"dpo: exported the policy to {out}")
  return state
