"""Training-Free GRPO (arXiv 2510.08191; docs/training_free_grpo.md): the policy stays frozen and
what is learned is an experience library in its prompt.

    python -m grpo_jax.train_training_free --config=configs/training_free_grpo_smollm2.py \\
        --workdir=DIR

Each step, on the loop skeleton (train/run/runner.py):
  1. tfgrpo.batch_size training problems, each with the library in its user turn
     (tfgrpo.prompts.problem), G = rollout.group_size completions at rollout.temperature by our
     sampler; a completion is correct when the task's held-out score (eval_accuracy, the binary
     verifier) is 1 for it. Scores go through train.on_reward_error as in every stage
     (grpo_jax/rewards/guard.py): a reward that raises or is not finite stops the run in one
     sentence ("raise"), or its completion counts as wrong and is counted
     (tfgrpo_reward_errors; "zero"), and more than train.max_reward_error_fraction of a step's
     completions failed stops the run before the library changes;
  2. groups with some but not all completions correct are kept; every kept completion is
     summarised (prompts.summary: its grade and the gold answer given), and each kept group's
     summaries give one critique (prompts.critique) ending in a JSON list of operations, of
     which the first is kept;
  3. the adds join the library, and one revision call (prompts.batch_update) modifies or merges
     (training_free/library.py); the ids are renumbered.
The summariser is the policy itself (tfgrpo.summariser_path '') or another HF folder, answering
greedily with the chat template. Held-out accuracy (greedy, the task's eval scores) is measured
with the library at step 0 (empty: the base model; tfgrpo.seed_library, one lesson a line, starts
it with lessons written elsewhere) and at each evaluation.

The library after step k is written to DIR/library/step_k.json (and the summariser's prompts and
replies of that step to calls_k.json); a rerun resumes from the newest one that reads
(training_free/library_files.py: a damaged newer one is moved aside), under the recorded config
(train/run/workdir.py, as every stage), and since every sample's key comes from (seed, step)
the resumed run equals an uninterrupted one. The config is checked first
(training_free/checks.py: every stage's validation, config.imports, the tfgrpo section). Records
(metrics.jsonl): tfgrpo_kept_groups, tfgrpo_train_accuracy, tfgrpo_critiques_parsed,
tfgrpo_revision_parsed, tfgrpo_added / _modified / _merged / _skipped, tfgrpo_library_size,
tfgrpo_reward_errors (train.on_reward_error='zero'), the eval_* scores (eval_reward_errors when a
held-out completion's scoring failed, as in train/run/evaluation.py) and time_step_s.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from grpo_jax.data.tokenizer import pad_rows
from grpo_jax.prompt_batch import take_rows
from grpo_jax.rewards.guard import guarded_eval_scores
from grpo_jax.rollout.sampler import sample
from grpo_jax.training_free import library as lib
from grpo_jax.training_free.checks import check_training_free_config
from grpo_jax.training_free.library_files import LibraryFiles, LibraryState
from grpo_jax.train.run.faults import TerminationFlag, check_reward_error_fraction
from grpo_jax.train.run.metrics import MetricsWriter
from grpo_jax.train.run.runner import Schedule, run_steps
from grpo_jax.train.run.sections import ModelSection
from grpo_jax.train.run.setup import build_model, build_task, check_task_fits_model
from grpo_jax.train.run.workdir import WorkdirLock, check_workdir, open_records, resume_records
from grpo_jax.parallel.platform import devices_record

Chat = Callable[[list], list]  # user messages -> the replies, in order


def bucket(width: int, size: int = 64) -> int:
  return -(-width // size) * size


def sampler_chat(params, model_cfg, tokenizer, max_new_tokens: int, batch_size: int) -> Chat:
  """Greedy replies of a model to user messages through its chat template, batch_size at a
  time, prompts left-padded to a multiple of 64 tokens (few compiled shapes)."""
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

  def chat(messages: list) -> list:
    replies = []
    for start in range(0, len(messages), batch_size):
      texts = [tokenizer.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                             add_generation_prompt=True)
               for m in messages[start:start + batch_size]]
      ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
      tokens, mask = pad_rows(ids, bucket(max(map(len, ids))), pad, left=True)
      out, _ = sample(params, tokens, mask, jax.random.key(0), model_cfg=model_cfg,
                      max_new_tokens=max_new_tokens, temperature=0.0, eos_id=tokenizer.eos_token_id,
                      pad_id=pad)
      kept = np.asarray(out.completion_mask)
      replies += [tokenizer.decode(t[m].tolist(), skip_special_tokens=True)
                  for t, m in zip(np.asarray(out.completion_tokens), kept)]
    return replies

  return chat


def update_library(library: dict, problems: list, golds: list, completions: list,
                   correct: list, chat: Chat, prompts) -> tuple[dict, dict]:
  """Steps 2-3 of the module docstring for one batch: problems[i]'s G completions (texts) and
  their correctness -> (the renumbered library, the step's records)."""
  keep = lib.kept_groups(correct)
  groups = [i for i, k in enumerate(keep) if k]

  def grade(c):
    return f"This trajectory delivers **{'correct' if c else 'wrong'}** answer"

  summaries = chat([prompts.summary.format(trajectory=text, grade=grade(c), answer=golds[i])
                    for i in groups for text, c in zip(completions[i], correct[i])]
                   ) if groups else []
  critiques, at = [], 0
  for i in groups:
    g = len(completions[i])
    trajectories = "\n\n".join(
        f"Trajectory {j + 1} (Answer {'correct' if c else 'wrong'}):\n{s}"
        for j, (s, c) in enumerate(zip(summaries[at:at + g], correct[i])))
    critiques.append(prompts.critique.format(
        max_operations=1, problem=problems[i], trajectories=trajectories, answer=golds[i],
        experiences=lib.render(library)))
    at += g
  parsed = [lib.last_json_list(reply) for reply in (chat(critiques) if critiques else [])]
  operations = [op for ops in parsed if ops for op in ops[:1]]
  candidates, waiting, next_id, counts = lib.collect_candidates(library, operations)
  revised = None
  if candidates:
    plan = lib.last_json_list(chat([prompts.batch_update.format(
        experiences=candidates, updates=waiting)])[0])
    revised = plan is not None
    candidates, more = lib.apply_revision(candidates, plan or [], next_id)
    counts = counts + more
  new = lib.renumber(candidates)
  flat = [c for row in correct for c in row]
  return new, {"tfgrpo_kept_groups": len(groups),
               "tfgrpo_train_accuracy": float(np.mean(flat)) if flat else 0.0,
               "tfgrpo_critiques_parsed": sum(p is not None for p in parsed),
               "tfgrpo_revision_parsed": revised,
               **{f"tfgrpo_{k}": v for k, v in dataclasses.asdict(counts).items()},
               "tfgrpo_library_size": len(new)}


def train_training_free(config, workdir: str, chat: Chat | None = None, log=print) -> dict:
  """Runs the loop (module docstring); returns the final library. `chat` replaces the
  summariser (tests script it)."""
  check_training_free_config(config)  # every stage's validation (and config.imports) and its own
  t = config.tfgrpo
  check_workdir(workdir)
  library_files = LibraryFiles(workdir)
  library_files.newest()  # no step file reads: one sentence now, before the model is built
  task = build_task(config, log)
  key = jax.random.key(config.seed)
  model_cfg, params = build_model(ModelSection.of(config), jax.random.fold_in(key, 0))
  check_task_fits_model(model_cfg, task, config.train.eval_size, config.rollout.max_new_tokens)
  if chat is None:
    chat_params, chat_cfg, tokenizer = params, model_cfg, task.tokenizer
    if t.summariser_path:
      from grpo_jax.data.tokenizer import load_hf_tokenizer  # noqa: PLC0415
      from grpo_jax.models.hf import load_hf_checkpoint  # noqa: PLC0415
      chat_cfg, chat_params = load_hf_checkpoint(t.summariser_path,
                                                 compute_dtype=model_cfg.compute_dtype)
      tokenizer = load_hf_tokenizer(t.summariser_path)
    chat = sampler_chat(chat_params, chat_cfg, tokenizer, t.summary_max_new_tokens,
                        t.chat_batch_size)
  group, seed = config.rollout.group_size, int(config.seed)
  on_error = config.train.on_reward_error

  def completions_of(batch, library, key_, group_size, temperature):
    ids = [task.tokenizer(task.chat_prompt(lib.problem_prompt(t.prompts.problem, u, library)),
                          add_special_tokens=False)["input_ids"] for u in batch.user_text]
    tokens, mask = pad_rows(ids, bucket(max(map(len, ids))), task.pad_id, left=True)
    out, _ = sample(params, tokens, mask, key_, model_cfg=model_cfg,
                    max_new_tokens=config.rollout.max_new_tokens, temperature=temperature,
                    eos_id=task.eos_id, pad_id=task.pad_id, group_size=group_size)
    return np.asarray(out.completion_tokens), np.asarray(out.completion_mask)

  def advance(state):
    batch = task.train_batch(state.step * t.batch_size, t.batch_size, seed)
    step_key = jax.random.fold_in(jax.random.fold_in(key, 2), state.step)
    tokens, mask = completions_of(batch, state.library, step_key, group,
                                  config.rollout.temperature)
    rows = take_rows(batch, np.repeat(np.arange(t.batch_size), group))
    scores, failed = guarded_eval_scores(task, rows, tokens, mask, on_error, "training",
                                         "tfgrpo_reward_errors")
    # before anything of the step is done: a step mostly scored 0 must not write the library
    check_reward_error_fraction(int(failed.sum()), len(failed),
                                config.train.max_reward_error_fraction, state.step + 1)
    correct = ((scores["eval_accuracy"] >= 1.0) & ~failed).reshape(-1, group)  # failed: wrong
    texts = np.array(task.decode(tokens, mask), dtype=object).reshape(-1, group)
    calls = []

    def traced(messages):
      replies = chat(messages)
      calls.extend({"prompt": m, "reply": r} for m, r in zip(messages, replies))
      return replies

    library, record = update_library(state.library, list(batch.user_text), list(batch.gold),
                                     texts.tolist(), correct.tolist(), traced, t.prompts)
    library_files.save_calls(state.step + 1, calls)
    if on_error == "zero":
      record["tfgrpo_reward_errors"] = int(failed.sum())
    return LibraryState(state.step + 1, library), [[record]], None

  def evaluate(state, step):
    batch = task.test_batch(config.train.eval_size)
    tokens, mask = completions_of(batch, state.library, jax.random.key(0), 1, 0.0)
    scores, failed = guarded_eval_scores(task, batch, tokens, mask, on_error)
    if failed.any():  # train.on_reward_error='zero': scored 0, counted (as evaluation.py)
      scores["eval_reward_errors"] = failed.sum(keepdims=True).astype(np.float64)
    return [{k: float(np.mean(v)) for k, v in scores.items()}]

  def write(writer, state, first, records, tokens, seconds, clock):
    record = dict(records[-1][0], **({"time_step_s": seconds} if seconds else {}))
    log(f"tfgrpo step {first:>3}/{t.steps} | " + " | ".join(
        f"{k.removeprefix('tfgrpo_')} {v:.3f}" if isinstance(v, float) else
        f"{k.removeprefix('tfgrpo_')} {v}" for k, v in record.items()))
    writer.write(first, record)

  with WorkdirLock(workdir), TerminationFlag() as sigterm:
    devices = devices_record()  # resumed like every stage (train/run/workdir.py)
    state, damaged = library_files.newest()
    changes = open_records([config], [workdir], state is not None, devices, log,
                           free=("tfgrpo.steps",), missing_ok=True, stage="training_free",
                           length=())  # (no learning rate)
    library_files.set_aside(damaged, state.step if state else 0, log)
    resume_records([workdir], [config], state.step if state else None, changes, devices,
                   "training_free")
    writer = MetricsWriter(workdir, t.steps, stream=None)
    if state is not None:
      log(f"tfgrpo: resumed from {library_files.directory}/step_{state.step}.json")
    seed_library = lib.renumber(dict(enumerate(
        line.strip() for line in t.seed_library.splitlines() if line.strip())))
    state = run_steps(state or LibraryState(0, seed_library), advance, evaluate,
                      lambda *a: write(writer, *a),
                      schedule=Schedule(t.steps, config.train.eval_every, 1), ckpts=library_files,
                      sigterm=sigterm, resumed=state is not None)
    writer.close()
  log(f"tfgrpo: the library after step {state.step}:\n{lib.render(state.library)}")
  return state.library
