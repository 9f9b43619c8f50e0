"""The per-section checks grpo_jax/config.py's validate() runs on a resolved config: LoRA,
rewards (GFPO, the critic's start, the reward sources), devices (mesh, multi-host start-up),
on-policy distillation and fused steps, with the two helpers every check uses (errors.require
and one_of, also the tasks'). Each failure is one sentence naming the value and the fix."""

from __future__ import annotations

import math
import os

from grpo_jax.errors import ConfigError, one_of as _one_of, require as _require


FRACTIONS = ("warmup.carry_drop_fraction", "rm.policy_fraction", "dpo.policy_fraction")


def _validate_fractions(config) -> None:
  """Shares of a batch or of made pairs: finite and in [0, 1] (rm.policy_fraction = 2 made a
  negative count of pairs and an IndexError; the others acted as 0 or 1 without a word)."""
  for name in FRACTIONS:
    section, field = name.split(".")
    if field in (config.get(section) or {}):
      value = config[section][field]
      _require(isinstance(value, (int, float)) and 0 <= value <= 1,
               f"{name}={value!r}; use a fraction in [0, 1].")


def _validate_lora(config) -> None:
  lo = config.get("lora")
  if lo is None:
    return
  _require(isinstance(lo.rank, int) and lo.rank >= 0,
           f"lora.rank={lo.rank!r}; use 0 (full fine-tuning) or the adapters' rank, e.g. 32.")
  if lo.rank == 0:
    return
  _require(math.isfinite(lo.alpha) and lo.alpha > 0,
           f"lora.alpha={lo.alpha}; use a finite value > 0 (the scale is alpha / rank).")
  _require(lo.dropout == 0, f"lora.dropout={lo.dropout}: dropout on the adapters is not "
           f"supported (the sampler's and the update's policies would differ); use 0.0, as "
           f"verl's and TRL's GRPO-LoRA recipes do.")
  from grpo_jax.models.lora import parse_targets  # noqa: PLC0415
  try:
    parse_targets(lo.targets)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _require(config.rl.ref_update_every == 0,
           f"rl.ref_update_every={config.rl.ref_update_every} with lora.rank={lo.rank}: the "
           f"reference is the base model with the adapters off; set rl.ref_update_every=0.")


def _validate_rewards(config) -> None:
  """GFPO's kept count, the critic's start, and the reward sources (grpo_jax/rewards/sources.py)."""
  rl, r = config.rl, config.rollout
  keep = rl.gfpo_keep
  _require(isinstance(keep, int) and 0 <= keep <= r.group_size,
           f"rl.gfpo_keep={keep!r}; use 0 (off) or the number of the rollout.group_size="
           f"{r.group_size} samples of a prompt to keep (fewer than group_size).")
  if keep:
    from grpo_jax.rl.gfpo import GFPO_METRICS  # noqa: PLC0415
    _one_of(rl.gfpo_metric, GFPO_METRICS, "rl.gfpo_metric")
  init = rl.critic_init
  _one_of(init, ("policy", "reward_model"), "rl.critic_init")
  if init == "reward_model":
    _require(rl.value_head == "separate",
             f"rl.critic_init='reward_model' builds a separate critic; set "
             f"rl.value_head='separate' (now {rl.value_head!r}).")
    _require(bool(config.get("reward") and config.reward.get("models")),
             "rl.critic_init='reward_model' starts the critic from reward.models[0], but "
             "reward.models is empty; add a reward model or set rl.critic_init='policy'.")
  from grpo_jax.rewards.sources import check_reward_config  # noqa: PLC0415
  check_reward_config(config)


def _validate_devices(config) -> None:
  """The mesh sizes and the multi-host start-up mode."""
  for axis in ("data", "fsdp", "tensor", "expert", "context"):  # parallel/mesh.MESH_AXES
    size = config.mesh.get(axis, 1)
    _require(isinstance(size, int) and (size == -1 or size >= 1),
             f"mesh.{axis}={size!r}; use a device count >= 1, or -1 for the rest of the devices.")
  split = config.mesh.get("rollout_devices", 0)
  _require(isinstance(split, int) and split >= 0,
           f"mesh.rollout_devices={split!r}; use 0 (the sampler shares the learner's mesh) or "
           f"the number n >= 1 of last devices that form the sampler's mesh.")
  dist = config.get("distributed")
  if dist is not None:
    _one_of(dist.mode, ("none", "auto", "explicit"), "distributed.mode")


def _validate_distill(config) -> None:
  """rl.distill_*: on-policy distillation (grpo_jax/rl/distill.py)."""
  from grpo_jax.rl.distill import PLACEMENTS  # noqa: PLC0415
  rl = config.rl
  _one_of(rl.distill_in, PLACEMENTS, "rl.distill_in")
  _require(rl.distill_coef >= 0, f"rl.distill_coef={rl.distill_coef}; use 0 (off) or a weight "
           f"> 0 of the reverse KL to the teacher.")
  if rl.distill_coef == 0:
    _require(not rl.distill_teacher, f"rl.distill_teacher={rl.distill_teacher!r} is set, but "
             f"rl.distill_coef=0, so the teacher is never asked and the run is plain RL; set "
             f"rl.distill_coef > 0 (configs/distill_tiny.py uses 3.0), or rl.distill_teacher=''.")
    return
  remote = rl.distill_teacher.startswith(("http://", "https://"))  # checked at its /info
  _require(remote or os.path.isfile(os.path.join(rl.distill_teacher, "config.json")),
           f"rl.distill_teacher={rl.distill_teacher!r} is not a Hugging Face model folder (no "
           f"config.json) or an http(s) URL of a teacher's server; rl.distill_coef="
           f"{rl.distill_coef} needs one.")
  token_env = rl.get("distill_teacher_token_env") or ""
  _require(not token_env or remote, f"rl.distill_teacher_token_env={token_env!r} is for a "
           f"teacher's server, but rl.distill_teacher={rl.distill_teacher!r} is a folder; set "
           f"rl.distill_teacher_token_env=''.")
  _require(not token_env or bool(os.environ.get(token_env)), f"rl.distill_teacher_token_env="
           f"{token_env!r}, but the environment has no {token_env}; export {token_env}=TOKEN "
           f"(the token the teacher's server was started with).")
  if remote:  # the URL (no user:password@) and its client's deadline and retries
    from grpo_jax.rewards.remote_teacher import settings_problem, token_headers  # noqa: PLC0415
    token_headers(token_env)
    problem = settings_problem(rl.distill_teacher, rl.distill_teacher_timeout_s,
                               rl.distill_teacher_max_retries, rl.distill_teacher_backoff_s)
    _require(problem is None, problem)
  _require(not config.train.fused_steps, f"rl.distill_coef={rl.distill_coef}: the teacher scores "
           f"the samples on the host; set train.fused_steps=0.")
  _require(rl.distill_in == "reward" or rl.objective == "policy_gradient",
           f"rl.distill_in='loss' adds a term to the policy-gradient objective, but "
           f"rl.objective={rl.objective!r}; use rl.distill_in='reward'.")


def _host_reward(reward) -> bool:
  """Whether config.reward asks for more than the task's own reward: reward models, remote
  rewards, a rule weight or reward.combine (all applied on the host)."""
  return bool(reward and (reward.get("models") or reward.get("remote")
                          or reward.rule_weight != 1.0 or reward.combine != "sum"))


def _validate_fused(config, task) -> None:
  """train.fused_steps = K > 0, or train.experience_source "fused" / "fused_episodes" (K = 1),
  runs K whole RL iterations per host call (grpo_jax/train/sources/fused.py): the task's stream
  and reward must be JAX functions, and every host event (evaluation, checkpoint, the end) must
  fall between two calls. The host's "episodes" source scores by the environment alone."""
  tr = config.train
  k, source = tr.fused_steps, tr.experience_source
  _require(k >= 0, f"train.fused_steps={k}; use 0 (host loop) or K > 0 steps per program.")
  _validate_episodes(config, task, source)
  if not k and source not in ("fused", "fused_episodes"):
    return
  what = f"train.fused_steps={k}" if k else f"train.experience_source={source!r}"
  off = ("set train.fused_steps=0" if k else "set train.experience_source='episodes'"
         if source == "fused_episodes" else "set train.experience_source=''")
  if source != "fused_episodes":  # (its environment is the JAX functions)
    task.require("device", f"{what} (data stream and reward as JAX functions)", off)
  _require(not _host_reward(config.get("reward")) and not config.rl.gfpo_keep,
           f"{what} needs the task's own reward alone (reward models, remote rewards, weights, "
           f"reward.combine and GFPO run on the host); {off}.")
  _require(not config.rl.dynamic_sampling,
           f"{what} cannot resample (rl.dynamic_sampling draws a data-dependent number of "
           f"rounds); set rl.dynamic_sampling=False or {off.removeprefix('set ')}.")
  if not k:
    return
  for name, value in (("train.steps", tr.steps), ("train.eval_every", tr.eval_every),
                      ("train.checkpoint_every", tr.checkpoint_every)):
    _require(value % k == 0, f"{name}={value} is not a multiple of train.fused_steps={k}: "
             f"evaluations, checkpoints and the end fall between fused calls; make it one.")


def _validate_episodes(config, task, source: str) -> None:
  """The sources that play an environment's episodes ("episodes", "fused_episodes") need a task
  that has them; "episodes" keeps every episode it plays and rewards it by its environment
  alone; "fused_episodes" gives the estimator rewards only."""
  if source not in ("episodes", "fused_episodes"):
    return
  what = f"train.experience_source={source!r}"
  _require("episodes" in task.capabilities, f"{what} plays an environment's episodes; set "
           f"task.name='env' with a config.env section.")
  if source == "fused_episodes":
    from grpo_jax.rewards.estimator_inputs import step_needs  # noqa: PLC0415
    needs = step_needs(config)
    _require(not needs, f"{what} gives the estimator rewards only, but it needs "
             f"{', '.join(map(str, needs))}; use train.experience_source='episodes'.")
    return
  _require(not _host_reward(config.get("reward")),
           f"{what} rewards each episode by its environment alone; leave reward.models, "
           f"reward.remote, reward.rule_weight and reward.combine at their defaults.")
  _require(not (config.rl.gfpo_keep or config.rl.dynamic_sampling),
           f"{what} keeps every episode it plays; set rl.gfpo_keep=0 and "
           f"rl.dynamic_sampling=False.")
