"""The RL stage's checks of its config against its experience source and its mesh, before
any compute (train/stages/rl.py calls them)."""

from __future__ import annotations

from grpo_jax import config as config_lib
from grpo_jax.parallel.mesh import batch_axis_size
from grpo_jax.rewards.estimator_inputs import uses_greedy
from grpo_jax.rl.estimators import ESTIMATORS
from grpo_jax.train.sources.experience_source import EXPERIENCE_SOURCES, SourceSettings, source_name


def check_source(t_cfg, rl) -> None:
  """The experience source is registered, train.fused_steps runs only on "fused", and
  rl.pack_tokens only on "host" (its capacity is chosen on the host from each batch)."""
  name = source_name(t_cfg)
  EXPERIENCE_SOURCES.get(name)  # one sentence listing the valid names when unknown
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
