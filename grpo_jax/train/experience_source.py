"""Where the loop's experience comes from: a registry of experience sources
(train.experience_source; "" picks "fused" when train.fused_steps > 0, else "host").

A source is built once per run, `make(run, state, samples_out) -> advance`, and each call
`advance(state) -> (state, records, tokens)` moves the run forward: it gathers experience with
the current policy and applies the RL step (grpo_jax/train/step.py), returning one list of
per-seed metrics records and the step's token count per step it ran. The loop around it
(grpo_jax/train/loop.py: evaluation, records, checkpoints, signals) is the same for every
source.

    host   prompts and rewards on the host (train/collect.py), then the jitted RL step: one
           step per call (train/host_source.py)
    fused  prompts, sampling, reward and RL step in one jitted lax.scan: train.fused_steps
           steps per call (train/fused.py)

A source declares whether it is on-policy: its rows sampled, in the same call, by the params
the step then updates. Only then may the update reuse its own log-probs as the old ones
(experience.reuses_current_logprobs); for a source that is not (replayed or asynchronous
experience), the run turns rl.reuse_old_logprobs off, so the old log-probs are computed.
Registering one is a file:

    @register_experience_source("replay", on_policy=False)
    def make_replay(run, state, samples_out): ...
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from grpo_jax.models.partitioning import shardings
from grpo_jax.registry import Registry
from grpo_jax.rewards.estimator_inputs import step_needs
from grpo_jax.rewards.sources import RewardSources
from grpo_jax.train.seed_axis import SeedAxis
from grpo_jax.train.step import StepSpec


@dataclasses.dataclass(frozen=True)
class ExperienceSource:
  make: Callable  # make(run, state, samples_out) -> advance(state) -> (state, records, tokens)
  on_policy: bool = True


EXPERIENCE_SOURCES = Registry("train.experience_source")


def register_experience_source(name: str, on_policy: bool = True, replace: bool = False):
  """Decorator: registers make(run, state, samples_out) as the source `name`."""
  def add(make):
    EXPERIENCE_SOURCES.register(name, ExperienceSource(make, on_policy), replace=replace)
    return make
  return add


def source_name(train_cfg) -> str:
  """The run's source: train.experience_source, or by train.fused_steps when it is ""."""
  name = train_cfg.experience_source
  return name or ("fused" if train_cfg.fused_steps else "host")


def for_source(rl, train_cfg):
  """The rl section the step runs with: reuse_old_logprobs off for a source that is not
  on-policy (the same section otherwise)."""
  if EXPERIENCE_SOURCES.get(source_name(train_cfg)).on_policy or not rl.get(
      "reuse_old_logprobs", True):
    return rl
  rl = rl.copy_and_resolve_references()
  rl.reuse_old_logprobs = False
  return rl


@dataclasses.dataclass(frozen=True)
class Run:
  """What a source and the loop need besides the state: built once by loop.train."""
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
    return step_needs(self.config)


def state_jit_options(state, run: Run) -> dict:
  """Donate the state; on a mesh, keep its layout (so the next step compiles nothing new)."""
  options = dict(donate_argnums=0)
  if run.mesh is not None:
    options["out_shardings"] = (shardings(state, run.mesh), None)
  return options
