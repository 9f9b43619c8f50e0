"""The RL stage's checks of its config against its experience source and its mesh, before
any compute (train/stages/rl.py calls them)."""

from __future__ import annotations

from grpo_jax import config as config_lib
from grpo_jax.parallel.mesh import batch_axis_size
from grpo_jax.rewards.estimator_inputs import uses_greedy
from grpo_jax.rl.estimators import ESTIMATORS
# (imported to register the built-in experience sources that check_source looks up)
from grpo_jax.train.sources import episodes, fused, fused_episodes, host  # noqa: F401
from grpo_jax.train.learner.experience import reuses_current_logprobs
from grpo_jax.train.sources.experience_source import (EXPERIENCE_SOURCES, SourceSettings,
                                                      for_source, source_name)
from grpo_jax.train.sources.pipeline import check_pipeline


def check_rl_config(config) -> None:
  """Everything the RL stage refuses in its config before any compute: config.validate, the
  experience source (check_source) and a vision policy's settings. The sweep launcher's and
  --print_config's check too, so that they name what the run would refuse."""
  from grpo_jax.models.vision.build import check_vision_config  # noqa: PLC0415
  config_lib.validate(config)
  check_source(config.train, config.rl)
  check_vision_config(config)


def check_source(t_cfg, rl) -> None:
  """The experience source is registered, train.fused_steps runs only on "fused", and
  rl.pack_tokens only on "host" (its capacity is chosen on the host from each batch)."""
  name = source_name(t_cfg)
  source = EXPERIENCE_SOURCES.get(name)  # one sentence listing the valid names when unknown
  check_pipeline(rl, name, source.pipelines, rl.dynamic_sampling)
  if rl.get("is_batch_normalize"):
    stepped = for_source(rl, t_cfg)  # (a stale source recomputes the old log-probs)
    if stepped.num_micro_batches > 1 and reuses_current_logprobs(stepped):
      raise config_lib.ConfigError(
          f"rl.is_batch_normalize normalises over the rows one computation sees, and the "
          f"update reusing its own log-probs sees one of rl.num_micro_batches="
          f"{rl.num_micro_batches} micro-batches; set rl.reuse_old_logprobs=False (the whole "
          f"batch's mean) or rl.num_micro_batches=1.")
  if rl.pack_tokens and name != "host":
    raise config_lib.ConfigError(
        f"rl.pack_tokens={rl.pack_tokens} sizes each step's packed tokens on the host, but "
        f"train.experience_source={name!r} has no host between rollout and update; set "
        f"rl.pack_tokens=0 or train.experience_source='host'.")
  if t_cfg.fused_steps and name not in ("fused", "fused_episodes"):
    raise config_lib.ConfigError(
        f"train.fused_steps={t_cfg.fused_steps} runs on the fused experience source but "
        f"train.experience_source={name!r}; set one of them to its default.")


def check_batches_fit_mesh(rl, settings: SourceSettings, eval_batch_size: int, mesh) -> None:
  """Every batch must split evenly over the mesh's data x fsdp x expert devices (checked up
  front)."""
  size = batch_axis_size(mesh)
  if rl.pack_tokens and size > 1:
    raise config_lib.ConfigError(
        f"rl.pack_tokens={rl.pack_tokens} packs a micro-batch's tokens into one row, "
        f"which does not split over the {size} data x fsdp x expert devices of the mesh; set "
        f"rl.pack_tokens=0 on a data-parallel mesh.")
  num_prompts = settings.num_prompts
  batch = num_prompts * settings.update_group_size
  for name, value in ((f"the rollout batch (rollout.num_prompts={num_prompts} x "
                       f"rollout.group_size={settings.group_size}"
                       f"{', of which rl.gfpo_keep are kept' if settings.gfpo_keep else ''})",
                       batch),
                      ("a minibatch", batch // rl.num_minibatches),
                      ("a micro-batch", batch // rl.num_minibatches // rl.num_micro_batches),
                      ("train.eval_batch_size", eval_batch_size)):
    if value % size:
      raise config_lib.ConfigError(
          f"{name} = {value} does not split over the {size} devices of the mesh's data x fsdp "
          f"x expert axes ({mesh.shape['data']} x {mesh.shape['fsdp']} x "
          f"{mesh.shape['expert']}); make it a multiple of {size}.")
  if uses_greedy(ESTIMATORS.get(rl.advantage).needs) and num_prompts % size:
    raise config_lib.ConfigError(
        f"rl.advantage={rl.advantage!r} decodes one greedy row per prompt: "
        f"rollout.num_prompts={num_prompts} must be a multiple of the {size} data x fsdp x "
        f"expert devices.")


def check_seed_axis(t_cfg, stacked: bool) -> None:
  """The "episodes" source plays one seed's episodes per program: stacked seeds are refused
  before the devices start."""
  if stacked and source_name(t_cfg) == "episodes":
    raise config_lib.ConfigError("train.experience_source='episodes' runs one seed per "
                                 "program; run the seeds separately (without --vmap_seeds).")


def check_split_placement(rollout_devices: int, t_cfg, stacked: bool, processes: int) -> None:
  """mesh.rollout_devices > 0 (the sampler on a mesh of its own) needs a source that samples
  apart from its update (not one that owns the step in one program), one seed per program, and
  one process (a sync between two processes' devices is not built)."""
  if not rollout_devices:
    return
  name = source_name(t_cfg)
  if EXPERIENCE_SOURCES.get(name).owns_step:
    raise config_lib.ConfigError(
        f"mesh.rollout_devices={rollout_devices} puts the sampler on devices of its own, but "
        f"train.experience_source={name!r} samples and updates in one program on one mesh; "
        f"set mesh.rollout_devices=0 or train.experience_source='host'.")
  if stacked:
    raise config_lib.ConfigError(
        f"mesh.rollout_devices={rollout_devices}: stacked seeds run in one program on one "
        f"device; set mesh.rollout_devices=0 or run the seeds separately.")
  if processes > 1:
    raise config_lib.ConfigError(
        f"mesh.rollout_devices={rollout_devices} with {processes} processes: split placement "
        f"runs in one process for now; set mesh.rollout_devices=0 on a multi-host run.")


def check_batches_fit_sampler(rl, settings: SourceSettings, mesh) -> None:
  """On a sampler's own mesh (mesh.rollout_devices > 0), the sampled batch (num_prompts x
  rollout.group_size rows) and the greedy baseline's rows must split over its data x fsdp x
  expert devices, as on the learner's."""
  size = batch_axis_size(mesh)
  rows = settings.num_prompts * settings.group_size
  if rows % size:
    raise config_lib.ConfigError(
        f"the rollout batch (rollout.num_prompts={settings.num_prompts} x rollout.group_size="
        f"{settings.group_size}) = {rows} does not split over the {size} devices of the "
        f"sampler's mesh (mesh.rollout_devices); make it a multiple of {size}.")
  if uses_greedy(ESTIMATORS.get(rl.advantage).needs) and settings.num_prompts % size:
    raise config_lib.ConfigError(
        f"rl.advantage={rl.advantage!r} decodes one greedy row per prompt: "
        f"rollout.num_prompts={settings.num_prompts} must be a multiple of the {size} devices "
        f"of the sampler's mesh (mesh.rollout_devices).")
