"""S seeds of one config in one program: the S runs' states stacked on a leading axis and every
jitted piece of a step (warm-up, rollout, batch preparation, update, end of step, evaluation)
`vmap`ped over it; only the host work (prompts, rewards, metrics records) loops over seeds.

Seed s's records (workdir/seed_<s>/metrics.jsonl) equal those of a separate run with
config.seed = s, wall-clock fields aside (tests/test_seeds.py): the data stream, keys and
warm-up are the same functions of the seed, and a vmapped program computes each seed's numbers
as the un-vmapped one does. For small models this turns S launches (each paying start-up and
compilation, each too small to fill the machine) into one.

    python -m grpo_jax.main --config=configs/grpo_tiny.py --workdir=DIR --vmap_seeds=0,1,2

Limits: one device (the seed axis is not sharded), no dynamic sampling (its resampling rounds
differ between seeds), no multi-host start-up.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import config as config_lib
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.checkpoint import Checkpoints, step_of
from grpo_jax.train.collect import score_round
from grpo_jax.train.evaluation import evaluate_models
from grpo_jax.train.experience import make_prepare_batch, step_rollout_kl
from grpo_jax.train.faults import Preempted, TerminationFlag, check_skips
from grpo_jax.train.loop import initial_state, step_metrics, step_tokens
from grpo_jax.train.metrics import MetricsWriter, keep_records_until
from grpo_jax.train.setup import build_model, build_task
from grpo_jax.train.state import TrainState, end_of_step, make_optimizer, step_key
from grpo_jax.train.update import make_update_step
from grpo_jax.train.warmup import make_warmup_step, warmup_log_due
from grpo_jax.train.workdir import record_start, write_config


def over_seeds(fn, mode: str, in_axes=0):
  """fn applied to every seed's slice of its arguments (leading axis; in_axes as in jax.vmap,
  0 or None per positional argument): "vmap" batches the seeds into one computation, "map"
  loops over them inside the program (jax.lax.map), op for op the shapes of a single run."""
  if mode == "vmap":
    return jax.vmap(fn, in_axes=in_axes)
  if mode != "map":
    raise config_lib.ConfigError(f"--seed_axis={mode!r} is unknown; valid: vmap, map.")

  def mapped(*args):
    axes = in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
    batched = [a for a, ax in zip(args, axes) if ax is not None]

    def one(sliced):
      it = iter(sliced)
      return fn(*[next(it) if ax is not None else a for a, ax in zip(args, axes)])
    return jax.lax.map(one, batched)
  return mapped


def stack(trees):
  """Trees of equal structure -> one tree with a new leading axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree, index: int):
  return jax.tree.map(lambda x: x[index], tree)


def seed_workdir(workdir: str, seed: int) -> str:
  return os.path.join(workdir, f"seed_{seed}")


def check_vmappable(config, seeds) -> None:
  """One clear sentence for what a vmapped-seeds run cannot do."""
  if not seeds or len(set(seeds)) != len(seeds):
    raise config_lib.ConfigError(f"--vmap_seeds={','.join(map(str, seeds))}: give distinct "
                                 f"seeds, e.g. --vmap_seeds=0,1,2.")
  if config.rl.dynamic_sampling:
    raise config_lib.ConfigError(
        "rl.dynamic_sampling=True resamples a different number of rounds per seed, which one "
        "vmapped program cannot do; run the seeds separately (drop --vmap_seeds).")
  if config.get("distributed") is not None and config.distributed.mode != "none":
    raise config_lib.ConfigError(
        f"distributed.mode={config.distributed.mode!r}: vmapped seeds run in one process on "
        f"one device; set distributed.mode='none' or drop --vmap_seeds.")


def _seed_config(config, seed: int):
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.seed = seed
  return c


def _vmapped_warmup(params, task, model_cfg, warmup_cfg, seeds, log, seed_axis="vmap"):
  """run_warmup for every seed at once (each seed's own data stream)."""
  if warmup_cfg.steps <= 0:
    return params
  optimizer, step = make_warmup_step(model_cfg, warmup_cfg)
  step = jax.jit(over_seeds(step, seed_axis), donate_argnums=(0, 1))
  opt_state = stack([optimizer.init(unstack(params, i)) for i in range(len(seeds))])
  params = jax.tree.map(jnp.copy, params)
  for i in range(warmup_cfg.steps):
    batches = [task.warmup_batch(i, warmup_cfg.batch_size, s, warmup_cfg.carry_drop_fraction)
               for s in seeds]
    arrays = [np.stack([getattr(b, name) for b in batches]) for name in
              ("prompt_tokens", "prompt_mask", "target_tokens", "target_mask")]
    params, opt_state, loss = step(params, opt_state, *arrays)
    if warmup_log_due(i, warmup_cfg.steps):
      log(f"warm-up {i + 1:>5}/{warmup_cfg.steps} | sft loss per seed "
          f"{' '.join(f'{float(x):.4f}' for x in loss)}")
  return params


def train_seeds(config, seeds, workdir: str, log=print, seed_axis: str = "vmap") -> TrainState:
  """Runs config for every seed in `seeds` as one vmapped program (config.seed is ignored);
  returns the stacked final state. Checkpoints (of the stacked state) and resumption work as
  in `loop.train`, in workdir/checkpoints_seeds_<s1>_<s2>...; seed_axis "vmap" or "map" (see
  `over_seeds`)."""
  seeds = [int(s) for s in seeds]
  config_lib.validate(config)
  check_vmappable(config, seeds)
  task = build_task(config, log)
  configs = [_seed_config(config, s) for s in seeds]
  base_keys = [jax.random.key(s) for s in seeds]
  built = [build_model(c, jax.random.fold_in(k, 0)) for c, k in zip(configs, base_keys)]
  model_cfg = built[0][0]
  if model_cfg.vocab_size < len(task.tokenizer):
    raise config_lib.ConfigError(
        f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
        f"{len(task.tokenizer)} tokens; raise model.vocab_size.")
  params = stack([p for _, p in built])
  del built
  for c, s in zip(configs, seeds):
    write_config(c, seed_workdir(workdir, s))
  log(f"model: {sum(x.size for x in jax.tree.leaves(params)) // len(seeds):,} parameters, "
      f"{len(seeds)} seeds {seeds} vmapped in one program")
  rl, t_cfg = config.rl, config.train
  optimizer = make_optimizer(config.optim, t_cfg.steps * rl.num_iterations * rl.num_minibatches)
  make_state = lambda p, k: initial_state(config, model_cfg, p, optimizer, k)  # noqa: E731
  # Named by the seeds: a later run of other seeds in the same workdir starts its own.
  ckpts = Checkpoints(os.path.join(workdir, f"checkpoints_seeds_{'_'.join(map(str, seeds))}"),
                      t_cfg.keep_checkpoints, log)
  try:
    with TerminationFlag() as sigterm:
      template = jax.eval_shape(lambda p: stack([make_state(unstack(p, i), k)
                                                 for i, k in enumerate(base_keys)]), params)
      state = ckpts.restore_latest(template)
      resumed = state is not None
      for s in seeds:
        record_start(seed_workdir(workdir, s), step_of(state) if resumed else None)
        keep_records_until(os.path.join(seed_workdir(workdir, s), "metrics.jsonl"),
                           step_of(state) if resumed else -1)
      if resumed:
        log(f"resumed from checkpoint {ckpts.directory}/{step_of(state)} (no warm-up)")
      else:
        params = _vmapped_warmup(params, task, model_cfg, config.warmup, seeds, log, seed_axis)
        state = stack([make_state(unstack(params, i), k) for i, k in enumerate(base_keys)])
      del params
      return _run_seeds(config, workdir, seeds, base_keys, task, model_cfg, optimizer, state,
                        resumed, ckpts, sigterm, log, seed_axis)
  finally:
    ckpts.close()


def _run_seeds(config, workdir, seeds, base_keys, task, model_cfg, optimizer, state, resumed,
               ckpts, sigterm, log, seed_axis) -> TrainState:
  r_cfg, rl, t_cfg = config.rollout, config.rl, config.train
  num_seeds, group = len(seeds), r_cfg.group_size
  common = dict(model_cfg=model_cfg, max_new_tokens=r_cfg.max_new_tokens, eos_id=task.eos_id,
                pad_id=task.pad_id)
  sample = jax.jit(over_seeds(lambda p, t, m, k: generate(
      p, t, m, k, temperature=r_cfg.temperature, top_k=r_cfg.top_k, top_p=r_cfg.top_p,
      **common), seed_axis))
  greedy = jax.jit(over_seeds(lambda p, t, m: generate(p, t, m, jax.random.key(0),
                                                       temperature=0.0, **common), seed_axis))
  prepare = jax.jit(over_seeds(make_prepare_batch(model_cfg, rl, group, r_cfg.temperature,
                                                  r_cfg.max_new_tokens), seed_axis))
  update_step = jax.jit(over_seeds(make_update_step(model_cfg, rl, optimizer,
                                                    r_cfg.temperature), seed_axis))
  batch_size = r_cfg.num_prompts * group
  finish_step = jax.jit(over_seeds(lambda s, kl: end_of_step(s, rl, kl, batch_size), seed_axis))
  rollout_keys = jax.jit(jax.vmap(lambda s: jax.random.fold_in(step_key(s, 0), 0)))

  eval_keys = stack([jax.random.fold_in(k, 3) for k in base_keys])
  eval_common = dict(common, max_new_tokens=task.max_new_tokens)
  eval_greedy = jax.jit(over_seeds(lambda p, t, m: generate(
      p, t, m, jax.random.key(0), temperature=0.0, **eval_common), seed_axis,
      in_axes=(0, None, None)))
  eval_sampled = jax.jit(over_seeds(lambda p, t, m, k: generate(
      p, t, m, k, temperature=r_cfg.temperature, top_k=r_cfg.top_k, top_p=r_cfg.top_p,
      **eval_common), seed_axis, in_axes=(0, None, None, 0)))

  def run_eval(params):
    def generate_fn(prompts, mask, start, sampled):
      if sampled:
        keys = jax.vmap(lambda k: jax.random.fold_in(k, start))(eval_keys)
        return jax.device_get(eval_sampled(params, prompts, mask, keys))
      return jax.device_get(eval_greedy(params, prompts, mask))
    return evaluate_models(generate_fn, num_seeds, task, t_cfg)

  writers = [MetricsWriter(seed_workdir(workdir, s), t_cfg.steps, stream=None) for s in seeds]
  try:
    if not resumed:
      evals = run_eval(state.params)
      for writer, m in zip(writers, evals):
        writer.write(0, m)
      log(f"step    0/{t_cfg.steps} | eval_acc per seed "
          f"{_join(m['eval_accuracy'] for m in evals)}")
      if t_cfg.checkpoint_every:
        ckpts.save(state)
    first, start = step_of(state), time.perf_counter()
    while step_of(state) < t_cfg.steps:
      if sigterm.requested:
        ckpts.save(state)
        raise Preempted(f"SIGTERM: saved checkpoint {ckpts.directory}/{step_of(state)}; run "
                        f"the same command again to resume from it.")
      t0 = time.perf_counter()
      positions = np.asarray(state.data_position)
      prompts = [task.train_batch(int(p), r_cfg.num_prompts, s) for p, s in zip(positions, seeds)]
      rows = lambda name: np.stack([np.repeat(getattr(p, name), group, 0)  # noqa: E731
                                    for p in prompts])
      rollouts = jax.device_get(sample(state.params, rows("prompt_tokens"), rows("prompt_mask"),
                                       rollout_keys(state)))
      greedy_rollouts = None
      if rl.advantage == "remax":
        greedy_rollouts = jax.device_get(greedy(
            state.params, np.stack([p.prompt_tokens for p in prompts]),
            np.stack([p.prompt_mask for p in prompts])))
      collected = [score_round(task, prompts[i], unstack(rollouts, i),
                               None if greedy_rollouts is None else unstack(greedy_rollouts, i),
                               group, t_cfg.on_reward_error) for i in range(num_seeds)]
      batch, prep_metrics = prepare(state.params, state.value_params, state.ref_params,
                                    state.kl_coef, stack([c.rollout for c in collected]),
                                    stack([c.inputs for c in collected]))
      state, metrics = update_step(state, batch)
      state = finish_step(state, step_rollout_kl(prep_metrics, metrics))
      state = state.replace(data_position=state.data_position + jnp.asarray(
          [c.prompts_consumed for c in collected], jnp.int32))
      metrics, prep_metrics = jax.device_get((metrics, prep_metrics))
      kl_coefs = np.asarray(state.kl_coef)
      records = [step_metrics(unstack(metrics, i), unstack(prep_metrics, i), collected[i],
                              kl_coefs[i], config) for i in range(num_seeds)]
      step = step_of(state)
      if step % t_cfg.eval_every == 0 or step == t_cfg.steps:
        for record, m in zip(records, run_eval(state.params)):
          record.update(m)
      now = time.perf_counter()
      tokens = sum(step_tokens(c.rollout) for c in collected)
      for writer, record in zip(writers, records):
        record.update(step_time_s=now - t0, tokens_per_s=tokens / (now - t0),
                      elapsed_s=now - start)
        writer.write(step, record)
      eta = (t_cfg.steps - step) * (now - start) / (step - first)
      line = (f"step {step:>4}/{t_cfg.steps} | reward per seed "
              f"{_join(r['reward_mean'] for r in records)} | tok/s {tokens / (now - t0):,.0f} | "
              f"eta {int(eta) // 60}m{int(eta) % 60:02d}s")
      if "eval_accuracy" in records[0]:
        line += f" | eval_acc {_join(r['eval_accuracy'] for r in records)}"
      log(line)
      check_skips(int(np.max(np.asarray(state.consecutive_skips))),
                  t_cfg.max_consecutive_skips, step)
      if (t_cfg.checkpoint_every and step % t_cfg.checkpoint_every == 0) or step == t_cfg.steps:
        ckpts.save(state)
  finally:
    for writer in writers:
      writer.close()
  return state


def _join(values) -> str:
  return " ".join(f"{v:.3f}" for v in values)
