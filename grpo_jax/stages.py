"""The stages a command runs, by name: `python -m grpo_jax.main --stage=NAME` (default "rl").

    rl             the RL loop (grpo_jax/train/stages/rl.py)
    sft            supervised fine-tuning (grpo_jax/train/stages/supervised.py)
    rm             an outcome reward model (grpo_jax/train/stages/supervised.py)
    dpo            preference optimisation, the DPO family (grpo_jax/train/stages/preference.py)
    training_free  Training-Free GRPO (grpo_jax/training_free/loop.py)

An entry is run(config, workdir) (the RL stage's also takes seeds and seed_axis: --vmap_seeds)
and imports its stage when called, so that naming the stages (--help) starts nothing. A new
stage is one file that registers itself, named in config.imports:

    @STAGES.register("my_stage")
    def run_my_stage(config, workdir): ...

`python -m grpo_jax.train_sft` (and train_rm, train_dpo, train_training_free) are aliases of
`--stage=sft` (rm, dpo, training_free).
"""

from __future__ import annotations

from grpo_jax.registry import Registry

STAGES = Registry("--stage")


@STAGES.register("rl")
def run_rl(config, workdir, seeds=None, seed_axis="vmap"):
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  return train(config, workdir, seeds=seeds, seed_axis=seed_axis)


@STAGES.register("sft")
def run_sft(config, workdir):
  from grpo_jax.train.stages.supervised import train_sft  # noqa: PLC0415
  return train_sft(config, workdir)


@STAGES.register("rm")
def run_rm(config, workdir):
  from grpo_jax.train.stages.supervised import train_reward_model  # noqa: PLC0415
  return train_reward_model(config, workdir)


@STAGES.register("dpo")
def run_dpo(config, workdir):
  from grpo_jax.train.stages.preference import train_dpo  # noqa: PLC0415
  return train_dpo(config, workdir)


@STAGES.register("training_free")
def run_training_free(config, workdir):
  from grpo_jax.training_free.loop import train_training_free  # noqa: PLC0415
  return train_training_free(config, workdir)
