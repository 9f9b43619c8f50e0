"""The checks run on a resolved config before any compute (validate; the per-section checks it
calls, LoRA, rewards, devices, distillation and fused steps, are in grpo_jax/config_checks.py);
the defaults live in grpo_jax/defaults.py. Each failure is one sentence naming the value and
the fix."""

from __future__ import annotations

import math

from grpo_jax.errors import ConfigError
from grpo_jax.config_checks import (_one_of, _require, _validate_devices,
                                    _validate_distill, _validate_fractions, _validate_fused,
                                    _validate_lora, _validate_rewards)
from grpo_jax.rl.aggregation import LOSS_AGGREGATIONS

MODEL_DTYPES = ("bfloat16", "float16", "float32")  # model.param_dtype, model.compute_dtype


def update_group_size(config) -> int:
  """Completions per prompt in the update: rollout.group_size, or GFPO's kept rl.gfpo_keep."""
  return config.rl.gfpo_keep or config.rollout.group_size


def completion_cap(config) -> tuple[str, int]:
  """(field, value) of the longest completion the update sees, to which DAPO's overlong
  penalty counts: an episode source's env.max_completion_tokens (every id after the prompt,
  the policy's and the environment's; rollout.max_new_tokens caps one turn), else
  rollout.max_new_tokens."""
  if config.train.get("experience_source", "") in ("episodes", "fused_episodes"):
    return "env.max_completion_tokens", int(config.env.max_completion_tokens)
  return "rollout.max_new_tokens", int(config.rollout.max_new_tokens)


INT32_MAX = 2**31 - 1


def _check_integer_ranges(config, prefix: str = "") -> None:
  """Every integer field fits JAX's 32-bit integers (steps, sizes and counters become int32
  arrays), and config.seed is in [0, 2^32 - 1] (jax.random.key keeps 32 bits of it: larger
  seeds would alias smaller ones)."""
  for name, value in config.items():
    if hasattr(value, "items"):
      _check_integer_ranges(value, f"{prefix}{name}.")
    elif f"{prefix}{name}" == "seed":
      _require(isinstance(value, int) and 0 <= value <= 2**32 - 1,
               f"seed={value!r}; use a whole number in [0, {2**32 - 1}] (jax.random.key keeps "
               f"32 bits of it).")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT32_MAX:
      _require(False, f"{prefix}{name}={value} is beyond what JAX's 32-bit integers hold "
                      f"(|value| <= {INT32_MAX}); use a smaller value.")


def _validate_engines(config) -> None:
  """The run's rollout engines asked only for what they record and read: the one table of
  rollout/engine.py (ENGINES), one sentence from it otherwise."""
  from grpo_jax.rollout.engine import refuse  # noqa: PLC0415
  r, rl, env = config.rollout, config.rl, config.get("env") or {}
  engines = ["refill" if r.decode_slots else "static"]
  if config.train.get("experience_source", "") in ("episodes", "fused_episodes"):
    engines += ["episodes"] + ["continuation"] * bool(env.get("kv_continuation", False))
    engines += ["slot_continuation"] * bool(env.get("async_slots", 0))
  asked = dict(keep_mask=rl.keep_sampling_mask, weight_dtype=r.weight_dtype,
               record_routes=config.model.num_experts and rl.routing_replay == "rollout",
               images=config.model.get("vision") is not None)
  refuse(engines, [feature for feature, on in asked.items() if on])


def validate(config) -> None:
  """Checks a resolved config against the registries and every rule below; raises ConfigError
  (one sentence naming the value and the fix) on the first problem. config.imports is imported
  first, so a researcher's registered entries count."""
  import grpo_jax.builtins  # noqa: F401,PLC0415  the registries' built-in entries
  from grpo_jax.data.task import TASKS  # noqa: PLC0415
  from grpo_jax.registry import import_plugins  # noqa: PLC0415
  from grpo_jax.rl.estimators import ESTIMATORS  # noqa: PLC0415
  from grpo_jax.rl.kl import KL_ESTIMATORS  # noqa: PLC0415
  from grpo_jax.rl.losses import POLICY_LOSSES  # noqa: PLC0415
  import_plugins(config.imports, log=lambda *_: None)
  _check_integer_ranges(config)
  _validate_fractions(config)
  r, rl, tr, opt = config.rollout, config.rl, config.train, config.optim
  task = TASKS.get(config.task.name)
  estimator = ESTIMATORS.get(rl.advantage)
  ESTIMATORS.bind(rl.advantage, rl, estimator.fn)  # the entries' own checks
  POLICY_LOSSES.bind(rl.loss, rl)
  from grpo_jax.rl.objective import OBJECTIVES, make_objective  # noqa: PLC0415
  g = update_group_size(config)  # the update's groups: GFPO's kept rl.gfpo_keep when set
  compares = (f"rl.objective={rl.objective!r}" if OBJECTIVES.get(rl.objective).whole_groups
              else f"rl.advantage={rl.advantage!r}" if estimator.groups else "")
  _require(not (rl.gfpo_keep and compares) or g >= 2,
           f"rl.gfpo_keep={rl.gfpo_keep} keeps {g} of a prompt's completions for the update, but "
           f"{compares} compares the completions of a prompt; keep 2 to rollout.group_size="
           f"{r.group_size}, or set rl.gfpo_keep=0.")
  make_objective(rl, g)  # the objective's own checks
  KL_ESTIMATORS.get(rl.kl_estimator)
  _one_of(rl.loss_aggregation, LOSS_AGGREGATIONS, "rl.loss_aggregation")
  _one_of(rl.kl_in, ("loss", "reward"), "rl.kl_in")
  _one_of(rl.value_head, ("none", "shared", "separate"), "rl.value_head")
  _validate_capabilities(config, task)
  task.cls.check_config(config)
  from grpo_jax.rewards.estimator_inputs import check_inputs  # noqa: PLC0415
  why = check_inputs(estimator.needs, config, task, rl.advantage,
                     device=bool(tr.fused_steps))
  _require(why is None, why)
  _require(r.num_prompts >= 1, f"rollout.num_prompts={r.num_prompts}; use at least 1.")
  _require(r.max_new_tokens >= 1, f"rollout.max_new_tokens={r.max_new_tokens}; use at least 1 "
           f"(the completion length limit).")
  _require(tr.eval_pass_k >= 0, f"train.eval_pass_k={tr.eval_pass_k}; use 0 (off) or a number "
           f"of samples per prompt >= 1.")
  _one_of(config.model.param_dtype, MODEL_DTYPES, "model.param_dtype")
  _one_of(config.model.compute_dtype, MODEL_DTYPES + ("auto",), "model.compute_dtype")
  _require(r.group_size >= 1, f"rollout.group_size={r.group_size}; use at least 1.")
  if estimator.groups:
    _require(g >= 2,
             f"rollout.group_size={r.group_size} with rl.advantage={rl.advantage!r} leaves "
             f"groups of one, with no group mean or standard deviation to compare against; "
             f"use group_size >= 2 (or rl.advantage='gae' with a value head).")
    _require(r.temperature != 0,
             f"rollout.temperature={r.temperature} (greedy) makes the G completions of a prompt "
             f"identical, so rl.advantage={rl.advantage!r} compares equal rewards and nothing "
             f"learns; use a temperature > 0 (1.0 is usual).")
  if rl.keep_sampling_mask:
    _require(r.temperature > 0 and (r.top_p < 1 or r.top_k > 0),
             f"rl.keep_sampling_mask=True with rollout.temperature={r.temperature}, top_p="
             f"{r.top_p}, top_k={r.top_k} has no truncation to keep; sample with top_p < 1 or "
             f"top_k > 0 (and temperature > 0), or turn it off.")
  if rl.dynamic_sampling:
    _require(r.group_size >= 2, f"rl.dynamic_sampling needs groups to compare; "
             f"rollout.group_size={r.group_size}, use >= 2.")
  _require(estimator.shaped or not (rl.overlong_buffer or (rl.kl_in == "reward" and
                                                           rl.kl_coef > 0)),
           f"rl.advantage={rl.advantage!r} reads the step rewards, which the reward shaping of "
           f"rl.overlong_buffer={rl.overlong_buffer} and rl.kl_in={rl.kl_in!r} does not reach; "
           f"set rl.overlong_buffer=0 and rl.kl_in='loss'.")
  _require(not estimator.needs_critic or rl.value_head != "none",
           f"rl.advantage={rl.advantage!r} needs a critic, but rl.value_head='none'; set "
           f"rl.value_head to 'shared' or 'separate'.")
  _validate_rewards(config)
  batch = r.num_prompts * g
  _require(rl.num_minibatches >= 1 and batch % rl.num_minibatches == 0,
           f"the rollout batch of {batch} completions (rollout.num_prompts={r.num_prompts} x "
           f"rollout.group_size={r.group_size}) does not split into rl.num_minibatches="
           f"{rl.num_minibatches} equal minibatches; pick a divisor of {batch}.")
  minibatch = batch // rl.num_minibatches
  _require(rl.num_micro_batches >= 1 and minibatch % rl.num_micro_batches == 0,
           f"a minibatch of {minibatch} completions does not split into rl.num_micro_batches="
           f"{rl.num_micro_batches} equal micro-batches; pick a divisor of {minibatch}.")
  if OBJECTIVES.get(rl.objective).whole_groups:
    _require(minibatch % g == 0,
             f"rl.objective={rl.objective!r} compares the completions of one prompt, but a "
             f"minibatch holds {minibatch} completions, not whole groups of {g}; pick "
             f"rl.num_minibatches dividing rollout.num_prompts={r.num_prompts}.")
  if rl.shared_prompt_forward:
    micro = minibatch // rl.num_micro_batches
    _require(micro % g == 0,
             f"rl.shared_prompt_forward runs each prompt once for its {g} completions, but a "
             f"micro-batch holds {micro} completions; pick rl.num_minibatches x "
             f"rl.num_micro_batches so that a micro-batch holds whole groups, or set "
             f"rl.shared_prompt_forward=False.")
  _require(rl.num_iterations >= 1, f"rl.num_iterations={rl.num_iterations}; use at least 1.")
  from grpo_jax.models.quantized import WEIGHT_DTYPES  # noqa: PLC0415
  _require(r.weight_dtype in ("", *WEIGHT_DTYPES),
           f"rollout.weight_dtype={r.weight_dtype!r}; use '' (full precision) or one of "
           f"{sorted(WEIGHT_DTYPES)}.")
  _require(rl.routing_replay in ("off", "rollout"),
           f"rl.routing_replay={rl.routing_replay!r}; use 'off' or 'rollout'.")
  if config.model.num_experts:  # routing is recorded and replayed on the per-row forward
    _require(not rl.pack_tokens and not rl.shared_prompt_forward,
             f"an MoE model (model.num_experts={config.model.num_experts}) records its routing "
             f"on the per-row passes; set rl.pack_tokens=0 and rl.shared_prompt_forward=False.")
  else:
    _require(rl.routing_replay == "off" and not rl.router_aux_coef,
             f"rl.routing_replay={rl.routing_replay!r} / rl.router_aux_coef="
             f"{rl.router_aux_coef} need a mixture of experts (model.num_experts > 0); use "
             f"'off' and 0 for a dense model.")
  _require(rl.pack_tokens >= 0, f"rl.pack_tokens={rl.pack_tokens}; use 0 (off) or the number "
           f"of packed capacities a run may compile (8 is plenty).")
  _require(not (rl.pack_tokens and r.max_new_tokens < 2),
           f"rl.pack_tokens={rl.pack_tokens} packs each completion's tokens after its first, and "
           f"rollout.max_new_tokens={r.max_new_tokens} leaves none; set rl.pack_tokens=0.")
  _require(r.temperature >= 0, f"rollout.temperature={r.temperature}; use >= 0 (0 = greedy).")
  _require(0 < r.top_p <= 1, f"rollout.top_p={r.top_p}; use a value in (0, 1].")
  _require(r.top_k >= 0, f"rollout.top_k={r.top_k}; use 0 (off) or the number of most likely "
           f"tokens to sample from.")
  _require(isinstance(r.decode_block, int) and r.decode_block >= 0,
           f"rollout.decode_block={r.decode_block!r}; use a whole number of decode steps per "
           f"segment >= 0 (0 = one segment).")
  _require(isinstance(r.decode_slots, int) and r.decode_slots >= 0,
           f"rollout.decode_slots={r.get('decode_slots')!r}; use a whole number of decode slots "
           f">= 0 (0 = one per row, the static engine).")
  from grpo_jax.rollout.engine import DECODE_LOOPS  # noqa: PLC0415
  _one_of(r.get("decode_loop", "auto"), ("auto",) + DECODE_LOOPS, "rollout.decode_loop")
  _validate_engines(config)
  _require(math.isfinite(rl.kl_coef) and rl.kl_coef >= 0,
           f"rl.kl_coef={rl.kl_coef}; use a finite value >= 0 (0 turns KL off).")
  _require(rl.kl_clamp >= 0, f"rl.kl_clamp={rl.kl_clamp}; use 0 (off) or a bound > 0 on "
           f"|log pi - log pi_ref| (verl: 20).")
  eps, lam = rl.get("advantage_eps", 0.0), rl.get("lam", 1.0)
  _require(eps >= 0, f"rl.advantage_eps={eps}; use a value >= 0 added to the standard "
           f"deviation that divides the advantages (verl: 1e-6).")
  _require(0 <= lam <= 1, f"rl.lam={lam}; use a GAE lambda in [0, 1] (verl: 1.0).")
  _require(0 <= rl.gamma <= 1, f"rl.gamma={rl.gamma}; use a discount in [0, 1] (verl: 1.0).")
  _require(rl.overlong_penalty >= 0, f"rl.overlong_penalty={rl.overlong_penalty}; use a "
           f"value >= 0, the most DAPO's overlong shaping subtracts (1.0 in the paper).")
  _require(rl.value_head == "none" or (rl.value_clip_eps >= 0 and rl.value_coef >= 0),
           f"rl.value_clip_eps={rl.value_clip_eps}, rl.value_coef={rl.value_coef}; use values "
           f">= 0: the most the critic's values may move from the old ones, and the value "
           f"loss's weight (verl: 0.5 and 0.5).")
  _require(not rl.adaptive_kl or (rl.kl_target > 0 and rl.kl_horizon > 0 and rl.kl_coef > 0),
           f"rl.adaptive_kl needs rl.kl_coef > 0, rl.kl_target > 0 and rl.kl_horizon > 0 "
           f"(got {rl.kl_coef}, {rl.kl_target}, {rl.kl_horizon}).")
  _validate_distill(config)
  _require(0 < rl.ref_mix <= 1, f"rl.ref_mix={rl.ref_mix}; use a value in (0, 1].")
  _require(rl.tis_cap >= 0, f"rl.tis_cap={rl.tis_cap}; use 0 (off) or a positive cap.")
  from grpo_jax.rl.corrections import make_correction  # noqa: PLC0415
  _require(make_correction(rl) is None or not rl.tis_cap,  # (binding checks its thresholds)
           f"rl.tis_cap={rl.tis_cap} and rl.is_correction={rl.is_correction!r} both weight the "
           f"loss; set rl.tis_cap=0 (rl.is_correction='tis_token' with rl.is_high is the same "
           f"weights) or rl.is_correction='none'.")
  _require(not rl.unbiased_kl or (rl.kl_in == "loss" and rl.kl_coef > 0),
           f"rl.unbiased_kl weights the KL term of the loss, but rl.kl_in={rl.kl_in!r} and "
           f"rl.kl_coef={rl.kl_coef}; set rl.kl_in='loss' and rl.kl_coef > 0, or "
           f"rl.unbiased_kl=False.")
  _require(rl.opsm_delta >= 0, f"rl.opsm_delta={rl.opsm_delta}; use 0 (off) or a KL threshold "
           f"> 0 (slime's default 1e-4).")
  cap_field, cap = completion_cap(config)
  _require(0 <= rl.overlong_buffer < cap,
           f"rl.overlong_buffer={rl.overlong_buffer} must be in [0, {cap_field}={cap}).")
  _require(tr.steps >= 1, f"train.steps={tr.steps}; use at least 1.")
  _require(tr.eval_every >= 1, f"train.eval_every={tr.eval_every}; use at least 1.")
  _require(tr.eval_batch_size >= 1 and tr.eval_size >= 1,
           f"train.eval_size={tr.eval_size}, train.eval_batch_size={tr.eval_batch_size}; use "
           f"positive values.")
  _require(tr.checkpoint_every >= 0, f"train.checkpoint_every={tr.checkpoint_every}; use a "
           f"number of steps >= 0 (0 = only at the end and on SIGTERM).")
  _require(tr.keep_checkpoints >= 1, f"train.keep_checkpoints={tr.keep_checkpoints}; keep at "
           f"least 1 (2 or more lets a damaged newest checkpoint fall back to the previous).")
  _require(tr.no_signal_steps >= 0, f"train.no_signal_steps={tr.no_signal_steps}; use "
           f"a number of steps in a row without signal >= 0 (0: no such line).")
  _require(tr.max_consecutive_skips >= 1, f"train.max_consecutive_skips="
           f"{tr.max_consecutive_skips}; use at least 1.")
  _one_of(tr.on_reward_error, ("raise", "zero"), "train.on_reward_error")
  _one_of(tr.export_dtype, MODEL_DTYPES, "train.export_dtype")
  _require(tr.export_max_shard_mb >= 0, f"train.export_max_shard_mb={tr.export_max_shard_mb}; "
           f"use 0 (one file) or a shard size in MiB, e.g. 2000.")
  limit = tr.max_reward_error_fraction
  _require(0 <= limit <= 1, f"train.max_reward_error_fraction={limit}; use a fraction in "
           f"[0, 1] (0 stops at any failed reward, 1 never stops).")
  _validate_fused(config, task)
  check_wandb_config(tr)
  w = config.warmup
  _require(w.steps >= 0, f"warmup.steps={w.steps}; use 0 (no warm-up) or a number of steps.")
  _require(w.steps == 0 or w.batch_size >= 1, f"warmup.batch_size={w.batch_size}; use at least 1.")
  rates = [("optim.learning_rate", opt.learning_rate)]
  if config.warmup.steps > 0:  # no warm-up (real checkpoints): its rate is unused
    rates.append(("warmup.learning_rate", config.warmup.learning_rate))
  for name, value in rates:
    _require(math.isfinite(value) and value > 0,
             f"{name}={value}; use a finite value > 0 (1e-6 is usual for a real checkpoint).")
  for name in ("weight_decay", "b1", "b2"):
    _require(math.isfinite(opt[name]) and opt[name] >= 0,
             f"optim.{name}={opt[name]}; use a finite value >= 0.")
  _require(math.isfinite(opt.max_grad_norm) and opt.max_grad_norm > 0,
           f"optim.max_grad_norm={opt.max_grad_norm}; use a finite value > 0 (1.0 is usual).")
  margin = (config.get("rm") or {}).get("margin", 0.0)
  _require(math.isfinite(margin), f"rm.margin={margin}; use a finite margin of the "
           f"Bradley-Terry loss (0.0: none).")
  from grpo_jax.rl.lr_schedules import LR_SCHEDULES  # noqa: PLC0415
  _one_of(opt.get("schedule", "constant"), tuple(sorted(LR_SCHEDULES)), "optim.schedule")
  frac = opt.get("final_lr_fraction", 0.0)
  _require(math.isfinite(frac) and 0 <= frac <= 1, f"optim.final_lr_fraction={frac}; use a "
           f"fraction of the peak rate in [0, 1] (0: the rate falls toward 0).")
  _require(opt.b1 < 1 and opt.b2 < 1, f"optim.b1={opt.b1}, optim.b2={opt.b2}; AdamW's decay "
           f"rates must be below 1 (0.9 and 0.99 are usual).")
  for name in ("num_samples", "samples_every"):
    _require(tr[name] >= 0, f"train.{name}={tr[name]}; use a whole number >= 0 (num_samples 0: "
             f"no samples; samples_every 0: at every evaluation).")
  for name in ("max_extra_rollouts", "ref_update_every"):
    _require(rl[name] >= 0, f"rl.{name}={rl[name]}; use a whole number >= 0 (0: none).")
  _require(opt.warmup_steps >= 0, f"optim.warmup_steps={opt.warmup_steps}; use a number of "
           f"steps >= 0 (0: the full rate from the first step).")
  d = config.data
  _require(d.prompt_bucket >= 0, f"data.prompt_bucket={d.prompt_bucket}; use 0 (prompts left "
           f"at data.max_prompt_tokens) or a multiple > 0, e.g. 64.")
  _require(d.max_prompt_tokens >= 1, f"data.max_prompt_tokens={d.max_prompt_tokens}; use at "
           f"least 1 (the longest prompt in tokens).")
  m = config.model
  _require("scan_layers" not in m, f"model.scan_layers={m.get('scan_layers')!r}: the layers "
           f"are always stacked and scanned now (one param layout); delete the field.")
  from grpo_jax.models.decoder import REMAT_POLICIES  # noqa: PLC0415
  _one_of(m.remat, tuple(REMAT_POLICIES), "model.remat")
  from grpo_jax.models.config import (ATTENTION_IMPLS, CONTEXT_LAYOUTS,  # noqa: PLC0415
                                      ModelConfig)
  _one_of(m.get("attention_impl", "auto"), ("auto",) + ATTENTION_IMPLS, "model.attention_impl")
  _one_of(m.get("context_layout", "auto"), ("auto",) + CONTEXT_LAYOUTS, "model.context_layout")
  _require(m.logits_chunk >= 0, f"model.logits_chunk={m.get('logits_chunk')}; use 0 "
           f"(the whole completion at once) or a number of positions > 0, e.g. 64.")
  _validate_devices(config)
  _validate_lora(config)
  if m.path:
    return  # the checkpoint's config.json describes the model
  try:  # the random model's sizes, family and mixture, by ModelConfig's own checks (the
    # platform's choices left out: the backend starts after validation)
    ModelConfig.from_config_dict({**m, "compute_dtype": "float32", "attention_impl": "xla",
                                  "context_layout": "contiguous"})
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _validate_capabilities(config, task) -> None:
  """What the config asks of its task beyond the protocol, against what the task declares at
  registration (grpo_jax/data/task.py CAPABILITIES)."""
  w = config.warmup
  if w.steps > 0 and w.data_path:
    task.require("supervised", f"warmup.steps={w.steps} with warmup.data_path={w.data_path!r}",
                 "set warmup.steps=0")
  elif w.steps > 0:  # a data_path cannot fix this task: no fix that cannot work is offered
    fix = "set warmup.steps=0 (a real checkpoint needs none)"
    if "supervised" in task.capabilities:
      fix += ", or give warmup.data_path, a jsonl file of {prompt, response}"
    task.require("warmup", f"warmup.steps={w.steps} (a supervised warm-up on the task's own "
                 f"data)", fix)
  k = config.train.eval_pass_k
  _require(not (k and "episodes" in task.capabilities),
           f"train.eval_pass_k={k}: a task of episodes is evaluated on one greedy episode per "
           f"problem (train/run/evaluation.py), with no pass@k; set train.eval_pass_k=0.")


def check_wandb_config(train_cfg) -> None:
  """ConfigError when W&B logging is asked for but cannot work, before any compute."""
  project = train_cfg.wandb_project
  if not project:
    return
  _one_of(train_cfg.wandb_mode, ("online", "offline", "disabled"), "train.wandb_mode")
  try:
    import wandb  # noqa: F401,PLC0415
  except ImportError:
    raise ConfigError(f"train.wandb_project={project!r} needs the wandb package: pip install -e "
                      f"'.[wandb]' (or set train.wandb_project='').") from None
