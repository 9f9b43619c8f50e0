"""The host loop, the only one: set-up, warm-up, then RL steps with metrics records, held-out
evaluation, checkpoints and SIGTERM, for one seed or S seeds (a `SeedAxis`), whatever the
experience source.

The run's state is a RunState: the learner's TrainState and its experience source's
SourceState, checkpointed together. Each call of the learner's `advance`
(grpo_jax/train/stages/rl_advance.py) takes one Experience from the source
(grpo_jax/train/sources/experience_source.py: "host", prompts and rewards on the host; "fused",
train.fused_steps steps in one lax.scan; or a registered one) and applies the RL step to it.
Everything else here is the same for every source, and for any number of seeds.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import jax
import numpy as np

from grpo_jax import compile_log
from grpo_jax import config as config_lib
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.partitioning import place
from grpo_jax.models.vision.build import frozen_tower
from grpo_jax.models.value_head import critic_from_reward_model, init_value_params
from grpo_jax.parallel import distributed
from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.platform import (cpu_fallback_warning, devices_record, platform_line,
                                        start_backend)
from grpo_jax.parallel.mesh import bytes_per_device, role_meshes, split_heads_note
from grpo_jax.rewards.sources import RewardSources
from grpo_jax.train.run import files
from grpo_jax.train.run.checkpoint import Checkpoints, step_of
from grpo_jax.train.run.evaluation import evaluator_for
from grpo_jax.train.sources.experience_source import Run, SourceSettings, for_source
from grpo_jax.train.sources.pipeline import initial_in_flight
from grpo_jax.train.stages.rl_advance import make_advance
from grpo_jax.train.stages.rl_checks import (check_batches_fit_mesh, check_batches_fit_sampler,
                                             check_rl_config, check_seed_axis,
                                             check_split_placement)
from grpo_jax.train.run.reward_models import build_reward_sources
from grpo_jax.train.run.export import export_seeds
from grpo_jax.train.run.faults import TerminationFlag, check_skips, check_state_finite
from grpo_jax.train.run.metrics import MetricsWriter
from grpo_jax.train.run.no_signal import NoSignalWatch, warmup_check_line
from grpo_jax.train.run.runner import run_steps
from grpo_jax.train.run.samples import SamplesWriter, format_samples
from grpo_jax.train.run.summary import (closing_line, elapsed_before, longer_run, where_line,
                                         write_curves)
from grpo_jax.train.run.seed_axis import SeedAxis
from grpo_jax.train.run.sections import DeviceSection, LoraSection, Sections
from grpo_jax.train.run.setup import (build_model, build_task, check_task_fits_model,
                                      initial_adapters)
from grpo_jax.train.learner.state import (RunState, TrainState, create_source_state, create_train_state,
                                  make_optimizer, policy_params)
from grpo_jax.train.learner.step import StepSpec
from grpo_jax.train.run.wandb_logging import start_wandb
from grpo_jax.train.stages.warmup import check_warmup_fits, run_warmup, warmup_data, warmup_files
from grpo_jax.train.run.workdir import WorkdirLock, check_workdir, open_records, resume_records


def initial_state(rl, model_cfg: ModelConfig, params, optimizer, base_key,
                  sources: RewardSources = RewardSources(),
                  lora: LoraSection | None = None) -> TrainState:
  """The state at step 0 from the starting policy (a frozen reference copy, a fresh critic, or
  with rl.critic_init='reward_model' one from sources' first reward model); under LoRA, fresh
  adapters on `params` as the frozen base (and reference)."""
  if rl.critic_init == "reward_model":
    rm = sources.models[0]
    value_params = critic_from_reward_model(rm.params, rm.model_cfg, model_cfg)
  else:
    value_params = init_value_params(rl.value_head, model_cfg, params,
                                     jax.random.fold_in(base_key, 2))
  key = jax.random.fold_in(base_key, 1)
  if lora is not None:
    adapters = initial_adapters(lora, params, jax.random.fold_in(base_key, 4), model_cfg)
    return create_train_state(adapters, optimizer, key, value_params, rl.kl_coef,
                              base_params=params)
  return create_train_state(params, optimizer, key, value_params, rl.kl_coef)


def train(config, workdir: str, log=print, seeds=None, seed_axis: str = "vmap") -> RunState:
  """Runs RL steps until config.train.steps, resuming from the newest checkpoint if there is
  one (without the warm-up, whose result it holds); writes config.json, run_info.json and
  metrics.jsonl. With `seeds`, runs those seeds of the config as one program (config.seed
  ignored; seed_axis "vmap" or "map", see SeedAxis), each writing workdir/seed_<s>/, and
  returns the stacked state.

  Raises faults.Preempted after checkpointing the current step when SIGTERM arrives, and
  faults.RunStopped (RewardError included) when the run cannot go on.
  """
  started = time.perf_counter()
  check_rl_config(config)
  check_workdir(workdir)
  settings = SourceSettings.of(config)
  axis = (SeedAxis((int(config.seed),)) if seeds is None else
          SeedAxis(tuple(int(s) for s in seeds), seed_axis))
  configs = [_with_seed(config, s) for s in axis.seeds]
  rl = for_source(config.rl, config.train)  # no reuse of old log-probs for an off-policy source
  warm = config.warmup
  # The devices first: nothing may start JAX before the multi-host start-up and the backend.
  mesh, rollout_mesh = _start_devices(DeviceSection.of(config), axis, rl, settings,
                                      int(config.train.eval_batch_size), config.train)
  sections = Sections.of(config)
  if not distributed.is_main_process():
    log = lambda *a, **k: None  # noqa: E731  process 0 speaks and writes for everyone
  log(platform_line())
  workdirs = (workdir,) if not axis.stacked else tuple(os.path.join(workdir, f"seed_{s}")
                                                       for s in axis.seeds)
  log(where_line(workdir, per_seed=workdirs if axis.stacked else ()))
  compile_log.install(log)  # each program's compile said once (>= 1 s)
  if cpu_fallback_warning():
    log(cpu_fallback_warning())
  # Every input is read and checked before the workdir is touched: a bad one writes nothing.
  task = build_task(config, log)
  warm_data = warmup_data(config, task)
  base_keys = tuple(jax.random.key(s) for s in axis.seeds)
  built = [build_model(sections.model, jax.random.fold_in(k, 0), task) for k in base_keys]
  model_cfg, params = built[0][0], axis.stack([p for _, p in built])
  del built
  rollout = sections.eval.rollout
  check_task_fits_model(model_cfg, task, sections.eval.eval_size, rollout.max_new_tokens)
  check_warmup_fits(warm_data, model_cfg)
  sources = build_reward_sources(sections.rewards, sections.model, task, mesh)
  optimizer = make_optimizer(config.optim, settings.steps * rl.num_iterations *
                             rl.num_minibatches)
  if getattr(model_cfg, "vision", None) is not None and not model_cfg.train_tower:
    optimizer = frozen_tower(optimizer)  # model.vision.train_tower=False
  # (the longest completion, to which the overlong penalty counts: an episode's
  # env.max_completion_tokens, not one turn's rollout.max_new_tokens)
  spec = StepSpec(model_cfg, rl, optimizer, settings.update_group_size,
                  rollout.temperature, config_lib.completion_cap(config)[1])
  run = Run.of(config, axis, task, spec, base_keys, workdirs, mesh, log, sources,
               rollout_mesh=rollout_mesh)
  if rollout_mesh is not None:
    log(f"split placement: learner on devices {_ids(mesh)}, sampler on {_ids(rollout_mesh)} "
        f"(mesh {tuple(rollout_mesh.shape.values())}); weights synced after each update")
  # Process 0 writes for everyone, so it alone holds the workdir's lock (one run per workdir);
  # stacked seeds also lock each seed's folder, which a run of that seed alone may be given.
  with contextlib.ExitStack() as locks:
    if distributed.is_main_process():
      for wd in dict.fromkeys((workdir, *workdirs)):
        locks.enter_context(WorkdirLock(wd))
    return _train(run, sections, workdir, configs, warm, warm_data, params, started)


def _train(run: Run, sections: Sections, workdir: str, configs, warm, warm_data, params,
           started: float) -> RunState:
  """`train` once the inputs are checked, the devices are up and the workdir is this run's."""
  axis, log, mesh, workdirs = run.axis, run.log, run.mesh, run.workdirs
  model_cfg, base_keys, lora = run.spec.model_cfg, run.base_keys, sections.model.lora
  main_process = distributed.is_main_process()
  # Named by the seeds: a later run of other seeds in the same workdir starts its own.
  directory = ("checkpoints" if not axis.stacked else
               f"checkpoints_seeds_{'_'.join(map(str, axis.seeds))}")
  ckpts = Checkpoints(os.path.join(workdir, directory), sections.loop.keep_checkpoints, log)
  # A resume: under its recorded config, devices and seed axis, its record intact (workdir.py).
  devices = devices_record(mesh)
  changes, refusal, start = [{} for _ in workdirs], None, dict(
      stage="rl", data=warmup_files(configs[0]), seed_axis=axis.mode if axis.stacked else None)
  if main_process:
    try:
      changes = open_records(configs, workdirs, bool(ckpts.steps()), devices, log, **start,
                             checkpoints=ckpts.directory)
    except config_lib.ConfigError as e:
      refusal = e
  _all_processes_stop_with(refusal)
  try:
    with TerminationFlag() as sigterm:
      # Printed once SIGTERM / SIGINT / SIGHUP only set the flag: a signal after this line
      # stops the run at a step's end (before it, SIGINT's KeyboardInterrupt could land in a
      # library that swallows it, and a 10^6-step warm-up would then run on).
      count = sum(x.size for x in jax.tree.leaves(params)) // len(axis)
      log(f"model: {count:,} parameters, {model_cfg.param_dtype} weights, "
          f"{model_cfg.compute_dtype} compute" + (
              f", {len(axis)} seeds {list(axis.seeds)} in one program ({axis.mode})"
              if axis.stacked else ""))
      states = lambda p: axis.stack([  # noqa: E731
          RunState(t, create_source_state(t.key, initial_in_flight(
              run.spec.rl.get("max_staleness", 0), t.params))) for t in (
              initial_state(run.spec.rl, model_cfg, q, run.spec.optimizer, k, run.sources,
                            lora)
              for q, k in zip(axis.unstack(p), base_keys))])
      state = ckpts.restore_latest(jax.eval_shape(states, params))
      resumed = state is not None
      if main_process:
        dropped = resume_records(workdirs, configs, step_of(state) if resumed else None,
                                 changes, devices, **start)[-1]
      if resumed:
        if lora is not None:  # the frozen base is not in the checkpoint
          origin = "model.path" if sections.model.uses_checkpoint else "the seed"
          log(f"resumed from checkpoint {ckpts.directory}/{step_of(state)} (LoRA adapters; the "
              f"frozen base rebuilt from {origin}"
              f"{' and the warm-up' if warm.steps else ''})")
          base = run_warmup(params, warm_data, model_cfg, warm, axis, log)
          state = state.replace(train=state.train.replace(base_params=base))
        else:
          log(f"resumed from checkpoint {ckpts.directory}/{step_of(state)} (no warm-up)")
        if main_process:
          log(f"dropped {dropped} metrics records written after it")
      else:
        warmed = run_warmup(params, warm_data, model_cfg, warm, axis, log,
                            lambda: sigterm.requested, sections.loop.max_consecutive_skips)
        if sigterm.requested:  # the warm-up stopped early: nothing of this run is saved yet
          raise sigterm.stop("stopped during the warm-up, before the first checkpoint; run the "
                             "same command again to start over (the warm-up is a pure "
                             "function of the seed).")
        state = states(warmed)
      del params  # the state holds them (fresh) or a restored copy replaced them
      if mesh is not None:
        note = split_heads_note(model_cfg, mesh)
        if note:
          log(note)
        state = place(state, mesh)
        log(f"mesh ({', '.join(mesh.axis_names)}) = {tuple(mesh.shape.values())} over "
            f"{mesh.size} devices, {jax.process_count()} process(es); per device: params "
            f"{bytes_per_device(state.train.params) / 2**20:.2f} MiB, optimizer state "
            f"{bytes_per_device(state.train.opt_state) / 2**20:.2f} MiB, reference "
            f"{bytes_per_device(state.train.ref_params) / 2**20:.2f} MiB, frozen base "
            f"{bytes_per_device(state.train.base_params) / 2**20:.2f} MiB")
      # Under the run's mesh, the model's activation constraints (parallel/mesh.constrain)
      # take effect.
      with (jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()):
        return _run(run, sections, configs, state, resumed, ckpts, sigterm, started)
  finally:
    ckpts.close()


def _all_processes_stop_with(refusal: Exception | None) -> None:
  """Raises `refusal` (process 0's, which alone reads the workdir's record) in every process,
  so that none goes on to wait at the restore for the others."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # noqa: PLC0415
    refused = bool(multihost_utils.broadcast_one_to_all(np.int32(refusal is not None)))
    if refused and refusal is None:
      raise config_lib.ConfigError("process 0 refused to resume this workdir (its console says "
                                   "why); fix what it names and start every process again.")
  if refusal is not None:
    raise refusal


def _start_devices(devices: DeviceSection, axis: SeedAxis, rl, settings: SourceSettings,
                   eval_batch_size: int, t_cfg):
  """(learner's mesh, sampler's mesh) of a single-seed run (multi-host start-up first): the
  sampler's is None when it shares the learner's (mesh.rollout_devices = 0); both None for
  stacked seeds, which run in one process on one device."""
  dist = devices.distributed
  split = int(devices.mesh.get("rollout_devices", 0))
  check_seed_axis(t_cfg, axis.stacked)
  check_split_placement(split, t_cfg, axis.stacked, 1)
  if axis.stacked:
    if dist is not None and dist.mode != "none":
      raise config_lib.ConfigError(
          f"distributed.mode={dist.mode!r}: stacked seeds run in one process on one device; "
          f"set distributed.mode='none' or run the seeds separately.")
    start_backend(devices.compilation_cache)
    return None, None
  distributed.initialize(dist)
  start_backend(devices.compilation_cache)
  check_split_placement(split, t_cfg, axis.stacked, jax.process_count())
  try:
    mesh, rollout_mesh = role_meshes(devices.mesh, split)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  check_batches_fit_mesh(rl, settings, eval_batch_size, mesh)
  if rollout_mesh is not None:
    check_batches_fit_sampler(rl, settings, rollout_mesh)
  return mesh, rollout_mesh


def _ids(mesh) -> str:
  """A mesh's device ids, as a range when they are consecutive ("4-7")."""
  ids = sorted(d.id for d in mesh.devices.flat)
  return (f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1
          else ",".join(map(str, ids)))


def _with_seed(config, seed: int):
  if seed == config.seed:
    return config
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.seed = seed
  return c


def _run(run: Run, sections: Sections, configs, state, resumed: bool, ckpts,
         sigterm, started: float) -> RunState:
  """The RL steps from the state's step to train.steps (see `train`), then the export and
  the closing line; a finished run run again says so and does nothing else."""
  axis, log, t = run.axis, run.log, sections.loop
  finished = resumed and step_of(state) >= t.steps
  before = elapsed_before(run.workdirs[0]) if resumed else 0.0  # elapsed_s counts on
  if finished:
    log(f"this run is finished (step {step_of(state)}, train.steps={t.steps}): nothing to do; "
        f"{longer_run('rl', ('train.steps',), configs[0])}")
  pending = []  # sample records of the step being run (grpo_jax/train/run/samples.py)
  advance = make_advance(run, state, pending)
  run_eval = evaluator_for(run.task)(run.task, run.spec.model_cfg, sections.eval,
                            [jax.random.fold_in(k, 3) for k in run.base_keys], axis, run.mesh)
  enabled = distributed.is_main_process()
  writers = [MetricsWriter(wd, t.steps, stream=None if axis.stacked else sys.stdout,
                           enabled=enabled, wandb_run=start_wandb(c, wd) if enabled else None)
             for wd, c in zip(run.workdirs, configs)]
  samplers = [SamplesWriter(wd, enabled, w) for wd, w in zip(run.workdirs, writers)]

  labels = [f" (seed {s})" if axis.stacked else "" for s in axis.seeds]
  watches = [NoSignalWatch(t.no_signal_steps, c, log, label)
             for c, label in zip(configs, labels)]
  first_rewards = getattr(advance, "first_rewards", None)  # (None: a source owning the step)
  if not resumed and configs[0].warmup.steps and first_rewards is not None:
    for rewards, c, label in zip(first_rewards(state), configs, labels):
      log(warmup_check_line(rewards, run.settings.update_group_size, c, label))

  def evaluate(state, step):
    per_model = []
    evals = run_eval(policy_params(state.train), per_model)
    for sink, samples in zip(samplers, per_model):
      sink.write([dict(s, step=step) for s in samples])
    if not axis.stacked and per_model:  # (none with train.num_samples=0)
      for line in format_samples([dict(s, step=step) for s in per_model[0]]):
        log(line)
    return evals

  def check(state, records):
    step = step_of(state)
    for i, per_seed in enumerate(records):
      check_state_finite(per_seed, step - len(records) + 1 + i,
                         lambda: (ckpts.steps() or [None])[-1])
    if pending:
      samplers[0].write(pending)
      if not axis.stacked:
        for line in format_samples(pending):
          log(line)
      pending.clear()

  def draw_curves():
    if enabled:
      for wd in run.workdirs:
        write_curves(wd)

  def write(state, first, records, tokens, seconds, clock):
    if clock is None:  # step 0: the evaluation
      for writer, m in zip(writers, records[0]):
        writer.write(0, m)
      log(f"step    0/{t.steps} | eval_acc {_join(m['eval_accuracy'] for m in records[0])}")
      draw_curves()
      return
    per_step = seconds / len(records)
    for i, (per_seed, step_tokens_) in enumerate(zip(records, tokens)):
      at = first + i
      for writer, record in zip(writers, per_seed):
        record.update(step_time_s=per_step, tokens_per_s=step_tokens_ / per_step,
                      elapsed_s=before + clock.elapsed_s)
        writer.write(at, record)
      if axis.stacked:
        log(_seeds_line(at, t.steps, per_seed, step_tokens_ / per_step,
                        clock.eta(t.steps - at)))
      else:
        writers[0].progress(at, per_seed[0], clock.eta(t.steps - at))
      for watch, record in zip(watches, per_seed):
        watch.see(at, record)
    if "eval_accuracy" in records[-1][0]:
      draw_curves()
    check_skips(int(np.max(np.asarray(to_host(state.train.consecutive_skips)))),
                t.max_consecutive_skips, first + len(records) - 1)

  try:
    state = run_steps(state, advance, evaluate, write, check=check,
                      schedule=t.schedule,
                      ckpts=ckpts, sigterm=sigterm, resumed=resumed)
  finally:
    for writer in writers:
      writer.close()
  export_seeds(sections.model, state.train, run.spec.model_cfg, run.workdirs, axis, log, finished)
  if enabled:
    wall = None if finished else time.perf_counter() - started
    newest = (f"{os.path.basename(ckpts.directory)}/{step_of(state)}" if not axis.stacked
              else f"{ckpts.directory}/{step_of(state)}")  # (the seeds' shared folder)
    for wd in run.workdirs:
      exported = files.exists(files.path(wd, "hf_export", "config.json"))
      log(closing_line(wd, t.steps, wall, newest, exported))
  return state


def _join(values) -> str:
  return " ".join(f"{v:.3f}" for v in values)


def _seeds_line(step: int, total: int, records: list, tokens_per_s: float, eta: str) -> str:
  line = (f"step {step:>4}/{total} | reward per seed {_join(r['reward_mean'] for r in records)}"
          f" | tok/s {tokens_per_s:,.0f} | {eta}")
  if "eval_accuracy" in records[0]:
    line += f" | eval_acc {_join(r['eval_accuracy'] for r in records)}"
  return line
