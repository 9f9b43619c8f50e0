"""The supervised stages before RL (the SFT -> RM -> PPO pipeline: docs/rlhf_pipeline.md):

  SFT   python -m grpo_jax.train_sft --config=... --workdir=W: the warm-up as a stage of its own
        (the task's warm-up data, or a jsonl file of {prompt, response} with warmup.data_path;
        loss on the response tokens only), held-out accuracy at step 0 and at the end, the
        checkpoints and exact resume of the RL loop, the policy exported as a Hugging Face
        checkpoint to W/hf_export (the next stages' model.path).
  RM    python -m grpo_jax.train_rm --config=... --workdir=W: an outcome reward model trained
        on pairs {prompt, chosen, rejected} with the Bradley-Terry loss
        (grpo_jax/rl/preference.py; rm.train_path / rm.test_path read and checked as DPO's
        files are, before the model is built: grpo_jax/data/preference_files.py), started
        from model.path (the SFT policy, its lm_head dropped, a zero score head) or random;
        pairwise accuracy on the held-out pairs; the TrainState, checkpoints and exact resume
        of the RL loop; exported as a *ForSequenceClassification folder to W/hf_export
        (reward.models' path in PPO).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.data.preference_files import (Limits, check_fits_positions, fingerprints,
                                            read_preference_file, tokenize_preference_files)
from grpo_jax.data.supervised import PairData, addition_preference_pairs
from grpo_jax.errors import ConfigError
from grpo_jax.models.reward_model import (export_reward_model, init_reward_model,
                                          sequence_reward)
from grpo_jax.parallel.platform import devices_record, start_backend
from grpo_jax.rl.preference import bradley_terry_loss, pair_accuracy
from grpo_jax.train.run import files
from grpo_jax.train.run.checkpoint import Checkpoints, step_of
from grpo_jax.train.run.evaluation import evaluator_for
from grpo_jax.train.run.export import export_is_current, export_model_type, writing_export
from grpo_jax.train.run.faults import TerminationFlag, check_skips
from grpo_jax.train.run.metrics import MetricsWriter
from grpo_jax.train.run.runner import Schedule, run_steps
from grpo_jax.train.run.sections import EvalSection, ModelSection
from grpo_jax.train.run.summary import (CURVES, closing_line, longer_run, where_line,
                                         write_curves)
from grpo_jax.train.run.seed_axis import SeedAxis
from grpo_jax.train.run.wandb_logging import start_wandb
from grpo_jax.train.run.setup import build_model, build_task, check_task_fits_model
from grpo_jax.train.learner.state import (counted_skips, create_train_state, guarded_update,
                                          make_optimizer)
from grpo_jax.train.stages.warmup import (check_warmup_fits, make_warmup_step, warmup_data,
                                          warmup_files, warmup_log_due)
from grpo_jax.train.run.workdir import WorkdirLock, check_workdir, open_records, resume_records


def run_stage(name: str, config, workdir: str, fresh, advance, evaluate, report,
              schedule: Schedule, log=print, free: tuple = (), length: tuple = (),
              fresh_shape=None, restored=lambda state: state, data: dict | None = None,
              export=lambda state: None, metric: str = "eval_accuracy"):
  """A supervised stage on the loop skeleton (train/run/runner.py), inside the workdir's lock
  (WorkdirLock): the config recorded, the newest checkpoint restored (the records trimmed to its
  step) or `fresh()` started, `run_steps` with SIGTERM / SIGINT handled, each step's record said by
  report(step, record, clock) (its progress line; clock None at step 0), then written to
  metrics.jsonl (and the workdir's W&B run with train.wandb_project: wandb_logging.py); once
  train.max_consecutive_skips updates in a row were refused for a non-finite loss or gradient,
  the run stops there (faults.check_skips: RunStopped, exit 1), that step's record written,
  neither saved nor exported, as the RL loop does. A resume follows the RL run's rules
  (train/run/workdir.py), `free` naming the
  stage's own fields that may change, `length` those of its length (free under optim.schedule
  'constant' only: its rate decays over them); `fresh_shape` (default `fresh`) builds a state
  of the same structure cheaply, for restoring (a `fresh` that trains, a warm-up, is not traced);
  `restored(state)` puts back what a checkpoint does not hold (LoRA's frozen base); `data`: the
  fingerprints of the data files it reads ({config field: {path, sha256}}), recorded with the
  stage's name and compared on resume (train/run/resume_guards.py). `export(state)` writes the
  stage's result after the last step (not again when a finished run runs again and its export is
  there); then the closing line, with `metric`'s first and last held-out values
  (train/run/summary.py), and curves.png at each evaluation. Returns the last state."""
  started = time.perf_counter()

  def write(writer, state, first, records, tokens, seconds, clock):
    record = records[-1][0]
    report(first, record, clock)
    writer.write(first, record)
    if any(key in record for key, _ in CURVES):
      write_curves(workdir)
    check_skips(int(state.consecutive_skips), config.train.max_consecutive_skips, first)

  with WorkdirLock(workdir), TerminationFlag() as sigterm:
    log(where_line(workdir, tensorboard=False))
    ckpts = Checkpoints(os.path.join(workdir, "checkpoints"), config.train.keep_checkpoints, log)
    # Resumed like the RL run: under its recorded config, on its devices, its record intact.
    devices = devices_record()
    changes = open_records([config], [workdir], bool(ckpts.steps()), devices, log, free,
                           missing_ok=True, stage=name, data=data, length=length,
                           checkpoints=ckpts.directory)
    try:
      state = ckpts.restore_latest(jax.eval_shape(fresh_shape or fresh))
      resumed = state is not None
      resume_records([workdir], [config], step_of(state) if resumed else None, changes, devices,
                     name, data)
      writer = MetricsWriter(workdir, schedule.steps, stream=None,
                             wandb_run=start_wandb(config, workdir))
      finished = resumed and step_of(state) >= schedule.steps
      if finished:
        log(f"{name}: this run is finished (step {step_of(state)} of {schedule.steps}): "
            f"nothing to do; {longer_run(name, length, config)}")
      elif resumed:
        log(f"{name}: resumed from checkpoint {ckpts.directory}/{step_of(state)}")
      state = restored(state) if resumed else fresh()
      try:
        state = run_steps(state, advance, evaluate, functools.partial(write, writer),
                          schedule=schedule, ckpts=ckpts, sigterm=sigterm, resumed=resumed)
      finally:
        writer.close()
      if not (finished and export_is_current(workdir, ModelSection.of(config))):
        export(state)
      log(closing_line(workdir, schedule.steps,
                       None if finished else time.perf_counter() - started,
                       f"checkpoints/{step_of(state)}",
                       files.exists(files.path(workdir, "hf_export", "config.json")),
                       metric=metric))
    finally:
      ckpts.close()
  return state


def check_no_lora(config, name: str) -> None:
  """lora.rank > 0 refused by a stage that trains every parameter (SFT, RM)."""
  rank = config.get("lora", {}).get("rank", 0)
  if rank > 0:
    raise ConfigError(f"lora.rank={rank}: the {name} stage trains every parameter (LoRA is the "
                      f"DPO and RL stages'); set lora.rank=0.")


def stage_model(config, task, warm_data=None):
  """(key, model section, model_cfg, params, evaluate_policy) of a stage that measures held-out
  accuracy (SFT, DPO): config.seed's key, the model built from it and checked against the task
  and the warm-up's data (`warm_data`, warmup.warmup_data: check_warmup_fits), and its
  evaluator (evaluation.evaluator_for: episodes for an environment's task) over the prompts'
  full width."""
  key = jax.random.key(config.seed)
  model = ModelSection.of(config)
  evaluation = dataclasses.replace(EvalSection.of(config), prompt_bucket=0)  # full width
  model_cfg, params = build_model(model, jax.random.fold_in(key, 0))
  check_task_fits_model(model_cfg, task, evaluation.eval_size, evaluation.rollout.max_new_tokens)
  check_warmup_fits(warm_data, model_cfg)
  evaluate_policy = evaluator_for(task)(task, model_cfg, evaluation,
                                        [jax.random.fold_in(key, 3)], SeedAxis((int(config.seed),)))
  return key, model, model_cfg, params, evaluate_policy


# ----------------------------------------------------------------------------- SFT


def train_sft(config, workdir: str, log=print):
  """The SFT stage (module docstring) on the loop skeleton (train/run/runner.py): held-out accuracy
  at step 0 and at the end, the loss at every step, checkpoints every
  train.checkpoint_every steps, SIGTERM / SIGINT save and stop, and a rerun resumes from the
  newest checkpoint exactly. Returns the trained params."""
  config_lib.validate(config)
  check_no_lora(config, "sft")
  check_workdir(workdir)
  start_backend(config.train.compilation_cache)
  steps = config.warmup.steps
  if steps <= 0:
    raise ConfigError(f"warmup.steps={steps}: the SFT stage trains warmup.steps steps; set it "
                      f"> 0.")
  task = build_task(config, log)
  source = warmup_data(config, task)  # the file read and checked before the model
  key, model, model_cfg, params, evaluate_policy = stage_model(config, task, source)
  optimizer, sft_step = make_warmup_step(model_cfg, config.warmup)
  fresh = lambda: create_train_state(params, optimizer, jax.random.fold_in(key, 1)).replace(  # noqa: E731
      opt_state=optimizer.init(params))

  @functools.partial(jax.jit, donate_argnums=0)
  def step_fn(state, batch):
    new_params, opt_state, loss, applied = sft_step(state.params, state.opt_state, *batch)
    return counted_skips(state, applied).replace(params=new_params, opt_state=opt_state,
                                                 step=state.step + 1), loss

  seed, warm = int(config.seed), config.warmup
  fields = ("prompt_tokens", "prompt_mask", "target_tokens", "target_mask")

  def export(state):
    from grpo_jax.models.hf_export import export_hf_checkpoint  # noqa: PLC0415
    out = os.path.join(workdir, "hf_export")
    with writing_export(out, model) as folder:
      export_hf_checkpoint(state.params, model_cfg, folder, model.path or None,
                           export_model_type(model, model_cfg), dtype=model.export_dtype,
                           max_shard_bytes=model.export_max_shard_bytes)
    log(f"sft: exported the policy ({model.export_dtype}) to {out}")

  def advance(state):
    batch = source.warmup_batch(int(state.step), warm.batch_size, seed, warm.carry_drop_fraction)
    loss_mask = getattr(batch, "loss_mask", None)  # an episode's assistant tokens only
    state, loss = step_fn(state, tuple(getattr(batch, f) for f in fields) + (
        () if loss_mask is None else (loss_mask,)))
    return state, [[{"sft_loss": float(loss)}]], None

  def report(first, record, clock):
    if clock is not None and (warmup_log_due(first - 1, steps) or "eval_accuracy" in record):
      accuracy = (f" | eval_accuracy {record['eval_accuracy']:.3f}"
                  if "eval_accuracy" in record else "")
      log(f"sft step {first:>5}/{steps} | sft loss {record['sft_loss']:.4f}{accuracy}")

  return run_stage("sft", config, workdir, fresh, advance,
                   lambda state, step: evaluate_policy(state.params), report,
                   Schedule(steps, steps, config.train.checkpoint_every), log,
                   data=warmup_files(config), export=export).params


# ----------------------------------------------------------------------------- reward model


def check_pair_sources(config, section: str = "rm") -> None:
  """Where each split's preference pairs come from (config.<section>: rm, dpo), against what
  the task declared: a file needs a task that tokenises {prompt, response} text, no file one
  that makes pairs itself."""
  from grpo_jax.data.task import TASKS  # noqa: PLC0415
  entry = TASKS.get(config.task.name)
  for split in ("train", "test"):
    path = config[section][f"{split}_path"]
    if path:
      entry.require("supervised", f"{section}.{split}_path={path!r}", "use a task that tokenises "
                    "text pairs (addition, gsm8k)")
    else:
      entry.require("preference_pairs", f"{section}.{split}_path='' (pairs made by the task)",
                    "give a jsonl file of {prompt, chosen, rejected}")


def preference_pairs(config, section: str, task, split: str, policy=None) -> list[dict]:
  """The pairs of a split whose config.<section>.<split>_path (rm, dpo) is empty, made from
  the task (a file's pairs are read by grpo_jax/data/preference_files.py): with a starting
  `policy` (model_cfg, params) a share policy_fraction of them on-policy (the right answer
  against the policy's own wrong samples, `policy_pairs`: the mistakes RL will meet), the rest
  synthetic (`addition_preference_pairs`)."""
  c = config[section]
  count = c.train_pairs if split == "train" else c.test_pairs
  on_policy = []
  if policy is not None and c.policy_fraction > 0:
    on_policy = policy_pairs(config, task, split, *policy, int(count * c.policy_fraction))
  return on_policy + addition_preference_pairs(task, split, count - len(on_policy),
                                               int(config.seed))


def policy_pairs(config, task, split: str, model_cfg, params, count: int) -> list[dict]:
  """Up to `count` pairs {prompt, chosen: the right answer, rejected: a wrong completion the
  policy sampled} (at the rollout temperature, rollout.group_size samples per prompt, prompts
  of `split` in stream order), a pure function of the seed."""
  from grpo_jax.rollout.sampler import Sampling  # noqa: PLC0415
  group = config.rollout.group_size
  sample = jax.jit(Sampling.of(model_cfg, task, config.rollout).grouped(group))
  key = jax.random.fold_in(jax.random.key(config.seed), 6 if split == "train" else 7)
  decode = task.tokenizer.decode
  pairs, position, batch = [], 0, 256
  while len(pairs) < count:
    if split == "train":
      prompts = task.train_batch(position, batch, int(config.seed) + 3)
    else:
      rows = (position + np.arange(batch)) % len(task.test_pairs)
      prompts = task.encode(task.test_pairs[rows])
    rollout = sample(params, prompts.prompt_tokens, prompts.prompt_mask,
                     jax.random.fold_in(key, position))
    tokens, mask = np.asarray(rollout.completion_tokens), np.asarray(rollout.completion_mask)
    right = task.score(prompts, tokens, mask, group)
    for row in np.flatnonzero(right == 0):
      p = row // group
      text = lambda t, m: decode(t[m.astype(bool)])  # noqa: E731
      pair = {"prompt": text(prompts.prompt_tokens[p], prompts.prompt_mask[p]),
              "chosen": text(prompts.target_tokens[p], prompts.target_mask[p]),
              "rejected": text(tokens[row], mask[row])}
      if pair["rejected"] != pair["chosen"]:  # (ids past the alphabet decode to nothing)
        pairs.append(pair)
    position += batch
    if position > 50 * max(count, 1):
      break  # a policy that is (almost) always right: the synthetic pairs fill in
  return pairs[:count]


def make_rm_step(model_cfg, optimizer, margin: float):
  """step(state, batch) -> (state, metrics): one AdamW step of the Bradley-Terry loss (not
  applied when the loss or a gradient is not finite)."""

  def rewards(params, b):
    chosen = sequence_reward(params, model_cfg, b.prompt_tokens, b.prompt_mask, b.chosen_tokens,
                             b.chosen_mask)
    rejected = sequence_reward(params, model_cfg, b.prompt_tokens, b.prompt_mask,
                               b.rejected_tokens, b.rejected_mask)
    return chosen, rejected

  def loss_fn(params, b):
    chosen, rejected = rewards(params, b)
    return bradley_terry_loss(chosen, rejected, margin), (chosen, rejected)

  def step(state, b):
    (loss, (chosen, rejected)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params,
                                                                                   b)
    state = guarded_update(state, grads, loss, optimizer)
    return state, dict(loss=loss, train_pair_accuracy=pair_accuracy(chosen, rejected),
                       reward_margin=jnp.mean(chosen - rejected))

  return step, jax.jit(rewards)


def padded_batches(count: int, batch_size: int):
  """(rows, padded) of each batch of the rows [0, count), in order: `padded` is `rows` filled
  up with row 0 to batch_size rows, so that every batch has one shape."""
  for start in range(0, count, batch_size):
    rows = np.arange(start, min(start + batch_size, count))
    yield rows, np.concatenate([rows, np.zeros(batch_size - len(rows), int)])


def evaluate_pairs(rewards, params, data: PairData, batch_size: int) -> dict:
  """Held-out pair accuracy and mean margin of `data` (every pair once)."""
  chosen, rejected = [], []
  for rows, padded in padded_batches(len(data), batch_size):
    c, r = rewards(params, data.batch(padded))
    chosen.append(np.asarray(c)[:len(rows)])
    rejected.append(np.asarray(r)[:len(rows)])
  chosen, rejected = np.concatenate(chosen), np.concatenate(rejected)
  return dict(pair_accuracy=float(np.mean(chosen > rejected)),
              eval_reward_margin=float(np.mean(chosen - rejected)))


def train_reward_model(config, workdir: str, log=print):
  """The RM stage (module docstring); resumes from the newest checkpoint. Returns the state."""
  config_lib.validate(config)
  check_no_lora(config, "rm")
  check_workdir(workdir)
  start_backend(config.train.compilation_cache)
  rm = config.rm
  for name in ("steps", "batch_size", "eval_every", "train_pairs", "test_pairs"):
    if rm[name] < 1:
      raise ConfigError(f"rm.{name}={rm[name]}; use at least 1.")
  check_pair_sources(config)
  # A split's file is read, tokenised and checked (each prompt within data.max_prompt_tokens,
  # no pair with the same chosen and rejected completion) before the model is built, and
  # against the model's positions once it is, as DPO's are; the task's pairs after it (a share
  # of them sampled from the starting policy).
  pair_files = {s: read_preference_file(f"rm.{s}_path", rm[f"{s}_path"], None)
                for s in ("train", "test") if rm[f"{s}_path"]}
  task = build_task(config, log)
  key = jax.random.key(config.seed)
  model = ModelSection.of(config)
  n = config.rollout.max_new_tokens
  tokenized = tokenize_preference_files(pair_files, task, Limits(config.data.max_prompt_tokens, n),
                                        "refuse", log)
  model_cfg, policy = build_model(model, jax.random.fold_in(key, 0))
  for s, t in tokenized.items():
    check_fits_positions(pair_files[s], t, n, model_cfg.max_position_embeddings)
  pairs = {s: t.data for s, t in tokenized.items()}
  train, test = (pairs[s] if s in pairs else PairData(task, preference_pairs(
      config, "rm", task, s, (model_cfg, policy)), n) for s in ("train", "test"))
  params = init_reward_model(model_cfg, jax.random.fold_in(key, 5), backbone=policy)
  del policy
  optimizer = make_optimizer(config.optim, rm.steps)
  fresh = lambda: create_train_state(params, optimizer, jax.random.fold_in(key, 1))  # noqa: E731
  step_fn, rewards = make_rm_step(model_cfg, optimizer, float(rm.margin))
  step_fn = jax.jit(step_fn, donate_argnums=0)
  seed = int(config.seed)

  def advance(state):
    batch = train.stream_batch(int(state.step) * rm.batch_size, rm.batch_size, seed)
    state, metrics = step_fn(state, batch)
    return state, [[{k: float(v) for k, v in metrics.items()}]], None

  def export(state):
    if rm.export:
      out = os.path.join(workdir, "hf_export")
      with writing_export(out, model) as folder:
        export_reward_model(state.params, model_cfg, folder, export_model_type(model, model_cfg),
                            task.pad_id, dtype=model.export_dtype,
                            max_shard_bytes=model.export_max_shard_bytes)
      log(f"rm: exported the reward model ({model.export_dtype}) to {out}")

  def report(first, record, clock):
    if clock is not None and "pair_accuracy" in record:
      log(f"rm step {first:>5}/{rm.steps} | loss {record['loss']:.4f} | held-out pair "
          f"accuracy {record['pair_accuracy']:.3f}")

  return run_stage(
      "rm", config, workdir, fresh, advance,
      lambda state, step: [evaluate_pairs(rewards, state.params, test, rm.batch_size)], report,
      Schedule(rm.steps, rm.eval_every, config.train.checkpoint_every), log,
      free=("rm.eval_every", "rm.export"), length=("rm.steps",),
      data=fingerprints(pair_files),
      export=export, metric="pair_accuracy")
