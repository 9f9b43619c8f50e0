"""Preference optimisation as a stage (python -m grpo_jax.train_dpo --config=... --workdir=W;
docs/dpo_family.md): a loss of grpo_jax/rl/dpo.py on {prompt, chosen, rejected} pairs.

  start      the SFT policy: model.path, then the task's warm-up when warmup.steps > 0 (so one
             command goes from a random model to DPO on the tiny task); it is also the frozen
             reference (state.ref_params), kept in every checkpoint.
  pairs      dpo.train_path / test_path (jsonl of {prompt, chosen, rejected}; for KTO also
             unpaired {prompt, completion, label}: LabelledData; every line read, checked and
             tokenised before the warm-up: data/preference_files.py), or made by the task as the
             RM's are (a share dpo.policy_fraction from the start's wrong samples, the rest
             synthetic).
  rounds     dpo.rounds = R > 0: Iterative RPO (Pang et al. 2024) instead: R rounds of
             dpo.steps steps, each on pairs of the round's start policy's own samples
             (`self_pairs`: rollout.group_size samples of each of dpo.round_prompts fresh
             training prompts, a correct one (the task's full reward) against a wrong one, up to
             dpo.pairs_per_prompt per prompt), each round's reference the policy at its start
             (the last round's result). The held-out pairs are then synthetic only, and their
             implicit rewards are measured against the current round's reference.
  reference  the reference's summed log-probs of every training pair computed once before the
             first step (dpo.reference="cached") or at each step ("on_the_fly"); none for a
             reference-free loss (simpo, orpo), which then keeps no copy of the weights
             either; KTO's z0 on the batch's mismatched pairs.
  LoRA       lora.rank > 0: the state holds the adapters, the frozen start is the base and the
             reference (no copy; rebuilt from model.path and the warm-up on resume, as in the
             RL loop), the export merges them and writes the PEFT adapter; with rounds each
             round's reference is the merged policy at its start.
  metrics    every step: loss, implicit rewards of chosen and rejected (β log π/π_ref), their
             margin, pair accuracy, log-probs; at step 0, every dpo.eval_every steps and at the
             end: held-out greedy accuracy (eval_accuracy) and those reward metrics on the
             held-out pairs (eval_pair_accuracy, eval_reward_margin, ...).
  the rest   checkpoints, signals, exact resume, export to W/hf_export: run_stage's.

This file holds the stage (its config checks, the rounds' own pairs, the loop's callbacks); the
step's pieces (log-prob sums, metrics, the update, the cached reference) are in
grpo_jax/train/stages/preference_step.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.data.preference_files import (ON_DEGENERATE_PAIR, Limits, check_fits_positions,
                                            fingerprints, read_preference_files,
                                            tokenize_preference_files)
from grpo_jax.data.chat import epoch_stream
from grpo_jax.data.supervised import LabelledData, PairData
from grpo_jax.errors import ConfigError
from grpo_jax.models.lora import merge
from grpo_jax.parallel.platform import start_backend
from grpo_jax.rl.dpo import PREFERENCE_LOSSES
from grpo_jax.train.run.runner import Schedule
from grpo_jax.train.run.seed_axis import SeedAxis
from grpo_jax.train.run.export import export_policy
from grpo_jax.train.run.setup import build_task, initial_adapters
from grpo_jax.train.stages.preference_step import (cache_reference, evaluate_pairs,
                                                   make_dpo_step, make_pair_logps, reported)
from grpo_jax.train.stages.supervised import (check_pair_sources, preference_pairs, run_stage,
                                              stage_model)
from grpo_jax.train.learner.state import (create_train_state, make_optimizer, policy_params,
                                  reference_params)
from grpo_jax.train.stages.warmup import run_warmup, warmup_data, warmup_files
from grpo_jax.train.run.workdir import check_workdir

REFERENCES = ("cached", "on_the_fly")


def check_dpo_config(config) -> dict:
  """dpo.* sizes and choices, in one sentence each, before any compute; returns the
  preference files read and checked (grpo_jax/data/preference_files.py), {split:
  PreferenceFile}."""
  d = config.dpo
  for name in ("steps", "batch_size", "eval_every", "train_pairs", "test_pairs"):
    if d[name] < 1:
      raise ConfigError(f"dpo.{name}={d[name]}; use at least 1.")
  if d.rounds < 0 or (d.rounds > 0 and (d.round_prompts < 1 or d.pairs_per_prompt < 1)):
    raise ConfigError(f"dpo.rounds={d.rounds}, dpo.round_prompts={d.round_prompts}, "
                      f"dpo.pairs_per_prompt={d.pairs_per_prompt}; use rounds 0 (offline pairs) "
                      f"or rounds >= 1 with round_prompts and pairs_per_prompt >= 1.")
  if d.rounds > 0 and d.train_path:
    raise ConfigError(f"dpo.train_path={d.train_path!r} is not read when dpo.rounds={d.rounds} "
                      f"(each round trains on the policy's own pairs); clear it, or set "
                      f"dpo.rounds=0 to train on the file.")
  if d.reference not in REFERENCES:
    raise ConfigError(f"dpo.reference={d.reference!r}; use one of {', '.join(REFERENCES)}.")
  if d.on_degenerate_pair not in ON_DEGENERATE_PAIR:
    raise ConfigError(f"dpo.on_degenerate_pair={d.on_degenerate_pair!r}; use one of "
                      f"{', '.join(ON_DEGENERATE_PAIR)}.")
  PREFERENCE_LOSSES.bind(d.loss, d)  # an unknown loss or a bad hyperparameter
  check_pair_sources(config, "dpo")
  return read_preference_files(d)


def self_pairs(config, task, sample, params, round_index: int) -> list[dict]:
  """Round `round_index`'s pairs {prompt, chosen: a correct sample, rejected: a wrong one} of
  `params` on dpo.round_prompts training prompts (the stream's slice for that round, so each
  round meets new problems), `sample` = the jitted grouped sampler; a pure function of the seed,
  the round and params. Per prompt the i-th distinct correct text meets the i-th distinct wrong
  one, up to dpo.pairs_per_prompt pairs; a prompt with no correct or no wrong sample makes none,
  and a wrong sample whose text is a correct one's is no wrong text."""
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
      bad = [t for t in dict.fromkeys(text(tokens[r], mask[r]) for r in rows if not right[r])
             if t not in good]  # a token that decodes to nothing can make a wrong row's text right
      prompt = text(prompts.prompt_tokens[p], prompts.prompt_mask[p])
      pairs += [{"prompt": prompt, "chosen": c, "rejected": r}
                for c, r in list(zip(good, bad))[:d.pairs_per_prompt]]
  return pairs


def train_dpo(config, workdir: str, log=print):
  """The preference-optimisation stage (module docstring); resumes from the newest
  checkpoint. Returns the last state."""
  config_lib.validate(config)
  check_workdir(workdir)
  files = check_dpo_config(config)
  start_backend(config.train.compilation_cache)
  d = config.dpo
  task = build_task(config, log)
  n = config.rollout.max_new_tokens
  tokenized = tokenize_preference_files(files, task, Limits(config.data.max_prompt_tokens, n),
                                        d.on_degenerate_pair, log)  # before model and warm-up
  warm_data = warmup_data(config, task)
  key, model, model_cfg, params, evaluate_policy = stage_model(config, task, warm_data)
  for split, t in tokenized.items():
    check_fits_positions(files[split], t, n, model_cfg.max_position_embeddings)
  seed, axis = int(config.seed), SeedAxis((int(config.seed),))
  rounds = int(d.rounds)
  total = d.steps * max(rounds, 1)
  optimizer = make_optimizer(config.optim, total)
  pair_logps, reference_free = make_pair_logps(model_cfg, d.loss)
  lora = model.lora

  def state_from(start):
    k = jax.random.fold_in(key, 1)
    if lora is not None:  # the start is the frozen base and the reference
      adapters = initial_adapters(lora, start, jax.random.fold_in(key, 4))
      state = create_train_state(adapters, optimizer, k, base_params=start)
      # Rounds move the reference off the base: a merged copy, there from the start so that
      # every checkpoint has one structure.
      return state if rounds == 0 else state.replace(ref_params=jax.tree.map(jnp.copy, start))
    state = create_train_state(start, optimizer, k)
    if reference_free and rounds == 0:  # nothing reads a reference
      return state
    return state.replace(ref_params=jax.tree.map(jnp.copy, start))

  @functools.cache
  def warmed():  # the SFT start, where the state holds no copy of it (see start_params)
    return run_warmup(params, warm_data, model_cfg, config.warmup, axis, log,
                      max_skips=config.train.max_consecutive_skips)

  def restored(state):
    if lora is not None:  # a checkpoint holds the adapters, not the frozen base
      log("dpo: the frozen base rebuilt from "
          f"{'model.path' if model.uses_checkpoint else 'the seed'}"
          f"{' and the warm-up' if config.warmup.steps else ''}")
      state = state.replace(base_params=warmed())
    return state

  def start_params(state):
    """The SFT start (offline pairs are made from its samples): the reference when the state
    holds one, else (a reference-free loss) rebuilt once."""
    ref = reference_params(state)
    return ref if ref is not None else warmed()

  step_fn = jax.jit(make_dpo_step(model_cfg, optimizer, d), donate_argnums=0)
  pair_logps = jax.jit(pair_logps)
  data = {}  # the pairs (and cached reference sums), made from the start on first use
  sample = None
  if rounds > 0:
    from grpo_jax.rollout.sampler import Sampling  # noqa: PLC0415
    sample = jax.jit(Sampling.of(model_cfg, task, config.rollout).grouped(
        config.rollout.group_size))

  def preference_data(split: str, start):
    """dpo.<split>_path's records (checked and tokenised before the warm-up), else the
    split's pairs made from the task."""
    if split in tokenized:
      return tokenized[split].data
    return PairData(task, preference_pairs(config, "dpo", task, split, start), n)

  def held_out(state):
    """The held-out pairs, made once: a share from the start's own wrong samples offline
    (state.ref_params is the start throughout), only synthetic ones with rounds (whose
    reference moves), so that a resumed run makes the same."""
    if "test" not in data:
      start = ((model_cfg, start_params(state)) if rounds == 0 and d.policy_fraction > 0
               else None)
      data["test"] = preference_data("test", start)
    return data["test"]

  def prepared(state) -> dict:
    """The current round's training pairs (round 0 without rounds), from state.ref_params."""
    held_out(state)
    r = int(state.step) // d.steps if rounds > 0 else 0
    if data.get("round") != r:
      if rounds > 0:
        made = self_pairs(config, task, sample, reference_params(state), r)
        if not made:
          raise ConfigError(f"dpo round {r}: the policy's samples of {d.round_prompts} prompts "
                            f"held no correct-wrong pair; raise dpo.round_prompts or "
                            f"rollout.group_size, or the rollout temperature.")
        log(f"dpo: round {r + 1}/{rounds}: {len(made)} pairs of the policy's own correct and "
            f"wrong samples ({d.round_prompts} prompts x {config.rollout.group_size})")
        train = PairData(task, made, n)
      else:
        start = (model_cfg, start_params(state)) if d.policy_fraction > 0 else None
        train = preference_data("train", start)
        kind = lambda x: ("labelled completions" if isinstance(x, LabelledData)  # noqa: E731
                          else "pairs")
        log(f"dpo: {len(train)} training {kind(train)}, {len(data['test'])} held-out "
            f"{kind(data['test'])}, loss {d.loss}")
      data.update(round=r, train=train)
      data.pop("ref", None)
      if d.reference == "cached" and not reference_free:
        data["ref"] = cache_reference(model_cfg, reference_params(state), data["train"],
                                      d.batch_size)
    return data

  def advance(state):
    if rounds > 0 and int(state.step) % d.steps == 0 and int(state.step) > 0:
      # A new round: its reference is the policy now (the last round's result).
      now = (jax.tree.map(jnp.copy, state.params) if lora is None else
             merge(state.base_params, state.params, model_cfg.lora_scale))
      state = state.replace(ref_params=now)
    pairs = prepared(state)
    step = int(state.step)
    position = (step if rounds == 0 else step % d.steps) * d.batch_size
    rows = np.asarray(epoch_stream(len(pairs["train"]), position, d.batch_size, seed))
    ref = tuple(x[rows] for x in pairs["ref"]) if "ref" in pairs else None
    state, metrics = step_fn(state, pairs["train"].batch(rows), ref)
    return state, [[reported(metrics)]], None

  def evaluate(state, step):
    scores = evaluate_policy(policy_params(state))[0]
    return [{**scores, **evaluate_pairs(pair_logps, reference_free, float(d.beta), state,
                                        held_out(state), d.batch_size)}]

  def report(first, record, clock):
    if "eval_accuracy" in record:  # step 0 (the start) and every evaluation after it
      loss = f" | loss {record['loss']:.4f}" if "loss" in record else " (the start)"
      kind = "pair" if "eval_pair_accuracy" in record else "label"
      margin = (f" | margin {record['eval_reward_margin']:.3f}"  # (none: one kind of label)
                if "eval_reward_margin" in record else "")
      log(f"dpo step {first:>5}/{total}{loss} | held-out accuracy "
          f"{record['eval_accuracy']:.3f} | held-out {kind} accuracy "
          f"{record[f'eval_{kind}_accuracy']:.3f}{margin}")

  return run_stage("dpo", config, workdir, lambda: state_from(warmed()), advance, evaluate,
                   report, Schedule(total, d.eval_every, config.train.checkpoint_every), log,
                   free=("dpo.eval_every", "dpo.export"),
                   length=("dpo.steps",) if rounds == 0 else ("dpo.rounds",),
                   fresh_shape=lambda: state_from(params), restored=restored,
                   data={**fingerprints(files), **warmup_files(config)},
                   export=lambda state: export_policy(model, state, model_cfg, workdir, log,
                                                      export=bool(d.export)))
