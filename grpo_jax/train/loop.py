"""The host loop, the only one: set-up, warm-up, then RL steps with metrics records, held-out
evaluation, checkpoints and SIGTERM, for one seed or S seeds (a `SeedAxis`), on the host path
or fused.

Each call of `advance` moves the run forward on the devices and returns its records:
  host path   prompts and rewards on the host (grpo_jax/train/collect.py), then the one jitted
              RL step (grpo_jax/train/step.py), state donated: one step;
  fused       prompts, sampling, reward and RL step in one jitted lax.scan
              (grpo_jax/train/fused.py): train.fused_steps steps.
Everything else here is the same for both, and for any number of seeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

import jax
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.value_head import critic_from_reward_model, init_value_params
from grpo_jax.parallel import distributed
from grpo_jax.parallel.distributed import to_host
from grpo_jax.parallel.mesh import (batch_axis_size, bytes_per_device, make_mesh, place_tree,
                                    shard_batch, split_heads_note, tree_shardings)
from grpo_jax.rewards.sources import RewardSources, build_reward_sources
from grpo_jax.rl.estimators import ESTIMATORS
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.checkpoint import Checkpoints, step_of
from grpo_jax.train.collect import Samplers, collect
from grpo_jax.train.evaluation import make_evaluator
from grpo_jax.train.export import export_policy
from grpo_jax.train.faults import (TerminationFlag, check_reward_error_fraction,
                                    check_skips, check_state_finite, reward_name)
from grpo_jax.train.metrics import (MetricsWriter, keep_records_until, rollout_metrics,
                                    step_record, step_tokens)
from grpo_jax.train.samples import SamplesWriter, format_samples, samples_due, train_samples
from grpo_jax.train.seed_axis import SeedAxis
from grpo_jax.train.setup import (build_model, build_task, check_task_fits_model,
                                   initial_adapters, uses_checkpoint, uses_lora)
from grpo_jax.train.state import (TrainState, create_train_state, make_optimizer, policy_params,
                                  step_key)
from grpo_jax.train.step import StepSpec, make_rl_step
from grpo_jax.train.wandb_logging import start_wandb
from grpo_jax.train.warmup import run_warmup
from grpo_jax.train.workdir import (WorkdirLock, check_resume_config, check_workdir,
                                     config_changes, record_start, write_config)


@dataclasses.dataclass(frozen=True)
class Run:
  """What the loop needs besides the state: built once by `train`."""
  config: object
  axis: SeedAxis
  task: object
  spec: StepSpec
  base_keys: tuple  # per seed: jax.random.key(seed)
  workdirs: tuple  # per seed: where its records go
  mesh: object  # a jax Mesh, or None (stacked seeds run on one device)
  log: object
  sources: RewardSources = RewardSources()  # the rewards and how they combine

  @property
  def needs(self) -> tuple:
    return ESTIMATORS.get(self.config.rl.advantage).needs


def initial_state(config, model_cfg: ModelConfig, params, optimizer, base_key,
                  sources: RewardSources = RewardSources()) -> TrainState:
  """The state at step 0 from the starting policy (a frozen reference copy, a fresh critic, or
  with rl.critic_init='reward_model' one from sources' first reward model); under LoRA, fresh
  adapters on `params` as the frozen base (and reference)."""
  if config.rl.get("critic_init", "policy") == "reward_model":
    rm = sources.models[0]
    value_params = critic_from_reward_model(rm.params, rm.model_cfg, model_cfg)
  else:
    value_params = init_value_params(config.rl.value_head, model_cfg, params,
                                     jax.random.fold_in(base_key, 2))
  key = jax.random.fold_in(base_key, 1)
  if uses_lora(config):
    adapters = initial_adapters(config, params, jax.random.fold_in(base_key, 4))
    return create_train_state(adapters, optimizer, key, value_params, config.rl.kl_coef,
                              base_params=params)
  return create_train_state(params, optimizer, key, value_params, config.rl.kl_coef)


def seed_workdir(workdir: str, seed: int) -> str:
  return os.path.join(workdir, f"seed_{seed}")


def train(config, workdir: str, log=print, seeds=None, seed_axis: str = "vmap") -> TrainState:
  """Runs RL steps until config.train.steps, resuming from the newest checkpoint if there is
  one (without the warm-up, whose result it holds); writes config.json, run_info.json and
  metrics.jsonl. With `seeds`, runs those seeds of the config as one program (config.seed
  ignored; seed_axis "vmap" or "map", see SeedAxis), each writing workdir/seed_<s>/, and
  returns the stacked state.

  Raises faults.Preempted after checkpointing the current step when SIGTERM arrives, and
  faults.RunStopped (RewardError included) when the run cannot go on.
  """
  config_lib.validate(config)
  check_workdir(workdir)
  axis = (SeedAxis((int(config.seed),)) if seeds is None else
          SeedAxis(tuple(int(s) for s in seeds), seed_axis))
  mesh = _start_devices(config, axis)
  if not distributed.is_main_process():
    log = lambda *a, **k: None  # noqa: E731  process 0 speaks and writes for everyone
  # Every input is read and checked before the workdir is touched: a bad one writes nothing.
  task = build_task(config, log)
  configs = [_with_seed(config, s) for s in axis.seeds]
  base_keys = tuple(jax.random.key(s) for s in axis.seeds)
  built = [build_model(c, jax.random.fold_in(k, 0)) for c, k in zip(configs, base_keys)]
  model_cfg, params = built[0][0], axis.stack([p for _, p in built])
  del built
  check_task_fits_model(config, model_cfg, task)
  sources = build_reward_sources(config, task, mesh, reward_name(task))  # reward models read
  # Process 0 writes for everyone, so it alone holds the workdir's lock (one run per workdir).
  with (WorkdirLock(workdir) if distributed.is_main_process() else contextlib.nullcontext()):
    return _train(config, workdir, log, axis, mesh, task, configs, base_keys, model_cfg, params,
                  sources)


def _train(config, workdir: str, log, axis: SeedAxis, mesh, task, configs, base_keys,
           model_cfg, params, sources: RewardSources) -> TrainState:
  """`train` once the inputs are checked, the devices are up and the workdir is this run's."""
  workdirs = (workdir,) if not axis.stacked else tuple(seed_workdir(workdir, s)
                                                       for s in axis.seeds)
  main_process = distributed.is_main_process()
  count = sum(x.size for x in jax.tree.leaves(params)) // len(axis)
  log(f"model: {count:,} parameters" + (f", {len(axis)} seeds {list(axis.seeds)} in one "
                                        f"program ({axis.mode})" if axis.stacked else ""))
  r_cfg, rl, t_cfg = config.rollout, config.rl, config.train
  optimizer = make_optimizer(config.optim, t_cfg.steps * rl.num_iterations * rl.num_minibatches)
  spec = StepSpec(model_cfg, rl, optimizer, config_lib.update_group_size(config),
                  r_cfg.temperature, r_cfg.max_new_tokens)
  run = Run(config, axis, task, spec, base_keys, workdirs, mesh, log, sources)
  # Named by the seeds: a later run of other seeds in the same workdir starts its own.
  directory = ("checkpoints" if not axis.stacked else
               f"checkpoints_seeds_{'_'.join(map(str, axis.seeds))}")
  ckpts = Checkpoints(os.path.join(workdir, directory), t_cfg.keep_checkpoints, log)
  # A workdir with checkpoints is resumed: under its recorded config only (workdir.py),
  # checked before config.json is rewritten.
  changes = [config_changes(c, wd) if ckpts.steps() else {} for c, wd in zip(configs, workdirs)]
  if main_process:
    for c, wd, changed in zip(configs, workdirs, changes):
      check_resume_config(changed, wd, bool(t_cfg.get("allow_config_change", False)))
    for c, wd in zip(configs, workdirs):
      write_config(c, wd)
  try:
    with TerminationFlag() as sigterm:
      states = lambda p: axis.stack([  # noqa: E731
          initial_state(config, model_cfg, q, optimizer, k, run.sources)
          for q, k in zip(axis.unstack(p), base_keys)])
      state = ckpts.restore_latest(jax.eval_shape(states, params))
      resumed = state is not None
      for wd, changed in zip(workdirs, changes) if main_process else ():
        record_start(wd, step_of(state) if resumed else None, changed)
        dropped = keep_records_until(os.path.join(wd, "metrics.jsonl"),
                                     step_of(state) if resumed else -1)
        if os.path.exists(os.path.join(wd, "samples.jsonl")):
          keep_records_until(os.path.join(wd, "samples.jsonl"), step_of(state) if resumed else -1)
      if resumed and uses_lora(config):  # the frozen base is not in the checkpoint
        origin = "model.path" if uses_checkpoint(config) else "the seed"
        log(f"resumed from checkpoint {ckpts.directory}/{step_of(state)} (LoRA adapters; the "
            f"frozen base rebuilt from {origin}"
            f"{' and the warm-up' if config.warmup.steps else ''})")
        base = run_warmup(params, task, model_cfg, config.warmup, axis, log)
        state = state.replace(base_params=base)
        if main_process:
          log(f"dropped {dropped} metrics records written after it")
      elif resumed:
        log(f"resumed from checkpoint {ckpts.directory}/{step_of(state)} (no warm-up)")
        if main_process:
          log(f"dropped {dropped} metrics records written after it")
      else:
        warmed = run_warmup(params, task, model_cfg, config.warmup, axis, log,
                            stop=lambda: sigterm.requested)
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
        state = place_tree(state, mesh)
        log(f"mesh (data, fsdp, tensor) = {tuple(mesh.shape.values())} over {mesh.size} "
            f"devices, {jax.process_count()} process(es); per device: params "
            f"{bytes_per_device(state.params) / 2**20:.2f} MiB, optimizer state "
            f"{bytes_per_device(state.opt_state) / 2**20:.2f} MiB, reference "
            f"{bytes_per_device(state.ref_params) / 2**20:.2f} MiB, frozen base "
            f"{bytes_per_device(state.base_params) / 2**20:.2f} MiB")
      # Under the run's mesh, the model's activation constraints (parallel/mesh.constrain)
      # take effect.
      with (jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()):
        return _run(run, state, resumed, ckpts, sigterm)
  finally:
    ckpts.close()


def _start_devices(config, axis: SeedAxis):
  """The mesh of a single-seed run (multi-host start-up first); None for stacked seeds, which
  run in one process on one device."""
  dist = config.get("distributed")
  if axis.stacked:
    if dist is not None and dist.mode != "none":
      raise config_lib.ConfigError(
          f"distributed.mode={dist.mode!r}: stacked seeds run in one process on one device; "
          f"set distributed.mode='none' or run the seeds separately.")
    return None
  distributed.initialize(dist)
  try:
    mesh = make_mesh(config.mesh)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  _check_batches_fit_mesh(config, mesh)
  return mesh


def _with_seed(config, seed: int):
  if seed == config.seed:
    return config
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.seed = seed
  return c


def _check_batches_fit_mesh(config, mesh) -> None:
  """Every batch must split evenly over the mesh's data x fsdp devices (checked up front)."""
  size = batch_axis_size(mesh)
  r, t = config.rollout, config.train
  batch = r.num_prompts * config_lib.update_group_size(config)
  for name, value in ((f"the rollout batch (rollout.num_prompts={r.num_prompts} x "
                       f"rollout.group_size={r.group_size}"
                       f"{', of which rl.gfpo_keep are kept' if config.rl.get('gfpo_keep') else ''})",
                       batch),
                      ("a minibatch", batch // config.rl.num_minibatches),
                      ("a micro-batch", batch // config.rl.num_minibatches //
                       config.rl.num_micro_batches),
                      ("train.eval_batch_size", t.eval_batch_size)):
    if value % size:
      raise config_lib.ConfigError(
          f"{name} = {value} does not split over the {size} devices of the mesh's data x fsdp "
          f"axes ({mesh.shape['data']} x {mesh.shape['fsdp']}); make it a multiple of {size}.")
  if "greedy_rewards" in ESTIMATORS.get(config.rl.advantage).needs and r.num_prompts % size:
    raise config_lib.ConfigError(
        f"rl.advantage={config.rl.advantage!r} decodes one greedy row per prompt: "
        f"rollout.num_prompts={r.num_prompts} must be a multiple of the {size} data x fsdp "
        f"devices.")


def _state_jit_options(state, run: Run) -> dict:
  """Donate the state; on a mesh, keep its layout (so the next step compiles nothing new)."""
  options = dict(donate_argnums=0)
  if run.mesh is not None:
    options["out_shardings"] = (tree_shardings(state, run.mesh), None)
  return options


def make_host_advance(run: Run, state, samples_out=None):
  """advance(state) -> (state, [per-seed records of the step], [its tokens]): the host path.
  On a step `samples_due`, the first seed's training samples are appended to samples_out."""
  config, axis, mesh = run.config, run.axis, run.mesh
  r_cfg = config.rollout
  sampling = Sampling.of(run.spec.model_cfg, run.task, r_cfg, mesh)
  place = ((lambda *xs: shard_batch(xs, mesh, replicate_indivisible=True))
           if mesh is not None else (lambda *xs: xs))
  grouped = sampling.grouped(r_cfg.group_size)
  samplers = Samplers(
      sample=axis.compile(lambda p, t, m, k: grouped.with_stats(p, *place(t, m), k)),
      greedy=axis.compile(lambda p, t, m: sampling.greedy()(p, *place(t, m),
                                                            jax.random.key(0))))
  rollout_keys = axis.compile(lambda s: step_key(s, 0))
  rl_step = axis.compile(make_rl_step(run.spec), **_state_jit_options(state, run))

  def advance(state):
    positions = np.atleast_1d(to_host(state.data_position)).tolist()
    started = time.perf_counter()
    collected = collect(policy_params(state), positions, axis.unstack(rollout_keys(state)),
                        run.task, config, samplers, axis, run.needs, run.sources)
    step = step_of(state) + 1
    if samples_out is not None and samples_due(config.train, step):
      samples_out.extend(train_samples(run.task, collected[0], run.spec.group_size, step,
                                       config.train.get("num_samples", 4)))
    for c in collected:  # before the update: a step mostly scored 0 must not train
      check_reward_error_fraction(c.reward_errors, c.scored,
                                  config.train.get("max_reward_error_fraction", 0.5),
                                  step_of(state) + 1)
    rollout, inputs = axis.stack([c.rollout for c in collected]), axis.stack(
        [c.inputs for c in collected])
    if mesh is not None:
      rollout, inputs = shard_batch((rollout, inputs), mesh)
    collected_at = time.perf_counter()
    state, metrics = rl_step(state, rollout, inputs)
    metrics = to_host(metrics)  # waits for the step
    timings = dict(time_rollout_s=collected[0].rollout_s,
                   time_reward_s=collected_at - started - collected[0].rollout_s,
                   time_update_s=time.perf_counter() - collected_at)
    # Rollout tokens/s: every seed's sampled tokens over the sampler calls' wall time.
    rollout_speed = (sum(c.decoded_tokens for c in collected) /
                     max(collected[0].rollout_s, 1e-9))
    per_reward = (lambda c: {} if run.sources.only_rule else  # noqa: E731
                  {f"reward/{n}_mean": v for n, v in c.reward_means.items()})
    records = [step_record(m, rollout_metrics(c.inputs.rewards, c.rollout.completion_mask,
                                              c.rollout.truncated, run.spec.group_size),
                           config, c.sampling_rounds, c.groups_without_spread, c.reward_errors)
               | dict(decode_slot_utilisation=c.decoded_tokens / max(c.slot_steps, 1),
                      rollout_tokens_per_s=rollout_speed,
                      prompt_width=int(np.shape(c.rollout.prompt_tokens)[-1]))
               | per_reward(c) | timings
               for m, c in zip(axis.unstack(metrics), collected)]
    return state, [records], [sum(step_tokens(c.rollout) for c in collected)]

  return advance


def _run(run: Run, state, resumed: bool, ckpts, sigterm) -> TrainState:
  """The RL steps from the state's step to config.train.steps (see `train`)."""
  config, axis, log = run.config, run.axis, run.log
  r_cfg, t_cfg = config.rollout, config.train
  pending = []  # sample records of the step being run (grpo_jax/train/samples.py)
  if t_cfg.get("fused_steps", 0):
    from grpo_jax.train.fused import make_fused_advance  # noqa: PLC0415
    advance = make_fused_advance(run, state, _state_jit_options(state, run))
  else:
    advance = make_host_advance(run, state, pending)
  run_eval = make_evaluator(run.task, run.spec.model_cfg, t_cfg, r_cfg,
                            [jax.random.fold_in(k, 3) for k in run.base_keys], axis, run.mesh,
                            config.data.prompt_bucket)
  enabled = distributed.is_main_process()
  writers = [MetricsWriter(wd, t_cfg.steps, stream=None if axis.stacked else sys.stdout,
                           enabled=enabled, wandb_run=start_wandb(c, wd) if enabled else None)
             for wd, c in zip(run.workdirs, [_with_seed(run.config, s) for s in axis.seeds])]
  samplers = [SamplesWriter(wd, enabled, w) for wd, w in zip(run.workdirs, writers)]

  def evaluate(step):
    per_model = []
    evals = run_eval(policy_params(state), per_model)
    for sink, samples in zip(samplers, per_model):
      sink.write([dict(s, step=step) for s in samples])
    if not axis.stacked:
      for line in format_samples([dict(s, step=step) for s in per_model[0]]):
        log(line)
    return evals

  try:
    if not resumed:
      evals = evaluate(0)
      for writer, m in zip(writers, evals):
        writer.write(0, m)
      log(f"step    0/{t_cfg.steps} | eval_acc {_join(m['eval_accuracy'] for m in evals)}")
      if t_cfg.checkpoint_every:
        ckpts.save(state)
    first, start = step_of(state), time.perf_counter()
    while step_of(state) < t_cfg.steps:
      if sigterm.requested:
        ckpts.save(state)
        raise sigterm.stop(f"saved checkpoint {ckpts.directory}/{step_of(state)}; run the "
                           f"same command again to resume from it.")
      t0 = time.perf_counter()
      state, records, tokens = advance(state)
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
      if step % t_cfg.eval_every == 0 or step == t_cfg.steps:
        for record, m in zip(records[-1], evaluate(step)):
          record.update(m)
      now = time.perf_counter()
      per_step = (now - t0) / len(records)
      for i, (per_seed, step_tokens_) in enumerate(zip(records, tokens)):
        at = step - len(records) + 1 + i
        for writer, record in zip(writers, per_seed):
          record.update(step_time_s=per_step, tokens_per_s=step_tokens_ / per_step,
                        elapsed_s=now - start)
          writer.write(at, record)
        if axis.stacked:
          log(_seeds_line(at, t_cfg.steps, per_seed, step_tokens_ / per_step,
                          (now - start) / (step - first)))
        else:
          writers[0].progress(at, per_seed[0], (now - start) / (step - first))
      check_skips(int(np.max(np.asarray(to_host(state.consecutive_skips)))),
                  t_cfg.max_consecutive_skips, step)
      if (t_cfg.checkpoint_every and step % t_cfg.checkpoint_every == 0) or step == t_cfg.steps:
        ckpts.save(state)
  finally:
    for writer in writers:
      writer.close()
  if uses_checkpoint(config) and not axis.stacked:
    export_policy(config, state, run.spec.model_cfg, run.workdirs[0], log)
  return state


def _join(values) -> str:
  return " ".join(f"{v:.3f}" for v in values)


def _seeds_line(step: int, total: int, records: list, tokens_per_s: float,
                seconds_per_step: float) -> str:
  eta = (total - step) * seconds_per_step
  line = (f"step {step:>4}/{total} | reward per seed {_join(r['reward_mean'] for r in records)}"
          f" | tok/s {tokens_per_s:,.0f} | eta {int(eta) // 60}m{int(eta) % 60:02d}s")
  if "eval_accuracy" in records[0]:
    line += f" | eval_acc {_join(r['eval_accuracy'] for r in records)}"
  return line
