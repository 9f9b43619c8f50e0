"""Where the learner's experience comes from: a registry of experience sources
(train.experience_source; "" picks "fused" when train.fused_steps > 0, else "host").

A source produces, the loop learns. It is built once per run, `make(run, state, samples_out)`
with the run's first `RunState`, and returns

    next_experience(train_state, source_state) -> (source_state, Experience)

Experience(rollout, reward_inputs, records, version, tokens): the rows to learn from (each
row's `Rollout.version` the policy step that sampled it), one host record per seed of what the
source measured, and the oldest row's version. The source owns a `SourceState` (data
position, rollout-key counter, anything in flight; grpo_jax/train/learner/state.py), checkpointed in
the same step as the learner's `TrainState`. The loop (grpo_jax/train/stages/rl_advance.py) calls the
RL step on each Experience; evaluation, records, checkpoints and signals are the same for
every source.

    host   prompts and rewards on the host (train/sources/collect.py): one experience per call
           (train/sources/host.py)
    fused  prompts, sampling, reward and RL step in one jitted lax.scan, train.fused_steps
           steps per call (train/sources/fused.py): a source that owns the step, whose `make` returns
           advance(run_state) -> (run_state, records, tokens) itself

A source declares `max_staleness`: how many updates older than the learner its rows may be
(0: sampled, in the same call, by the params the step then updates: today's on-policy
sources). Only at 0 may the update reuse its own log-probs as the old ones
(experience.reuses_current_logprobs); above it the run turns rl.reuse_old_logprobs off, so
the old log-probs are computed, and the loop refuses rows staler than declared. Registering
one is a file, inside the package or outside it (config.imports):

    @register_experience_source("replay", max_staleness=1)
    def make_replay(run, state, samples_out): ...
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax

from grpo_jax.models.partitioning import shardings
from grpo_jax.registry import Registry
from grpo_jax.rewards.estimator_inputs import step_needs
from grpo_jax.rewards.sources import RewardSources
from grpo_jax.rollout.types import Rollout
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.run.seed_axis import SeedAxis
from grpo_jax.train.learner.step import StepSpec


@dataclasses.dataclass(frozen=True)
class ExperienceSource:
  make: Callable  # make(run, state, samples_out) -> next_experience (or advance: owns_step)
  max_staleness: int = 0  # updates a row may lag the learner by; 0 = on-policy
  owns_step: bool = False  # make returns advance(run_state): the source runs the RL step


class Experience(NamedTuple):
  """One batch to learn from, stacked over the run's seeds (the RL step's inputs)."""
  rollout: Rollout
  reward_inputs: RewardInputs
  records: list  # per seed: {"rollout": rollout_metrics, sampling_rounds, ..., then the
  # source's own fields} (learner.learner_record puts them after the step's metrics)
  version: int  # the policy step that sampled the oldest row
  tokens: int  # prompt and completion tokens, every seed's (for tokens/s)


EXPERIENCE_SOURCES = Registry("train.experience_source")


def register_experience_source(name: str, max_staleness: int = 0, owns_step: bool = False,
                               replace: bool = False):
  """Decorator: registers make(run, state, samples_out) as the source `name`."""
  def add(make):
    EXPERIENCE_SOURCES.register(name, ExperienceSource(make, max_staleness, owns_step),
                                replace=replace)
    return make
  return add


def source_name(train_cfg) -> str:
  """The run's source: train.experience_source, or by train.fused_steps when it is ""."""
  name = train_cfg.experience_source
  return name or ("fused" if train_cfg.fused_steps else "host")


def for_source(rl, train_cfg):
  """The rl section the step runs with: reuse_old_logprobs off for a source whose rows may be
  stale (the same section otherwise)."""
  if not EXPERIENCE_SOURCES.get(source_name(train_cfg)).max_staleness or not rl.get(
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
  mesh: object  # the learner's jax Mesh, or None (stacked seeds run on one device)
  log: object
  sources: RewardSources = RewardSources()  # the rewards and how they combine
  rollout_mesh: object = None  # the sampler's mesh; None: the learner's

  @property
  def needs(self) -> tuple:
    return step_needs(self.config)

  @property
  def sampler_mesh(self):
    return self.mesh if self.rollout_mesh is None else self.rollout_mesh

  def sync_weights(self, params):
    """The learner's params as the sampler takes them: themselves when both roles share one
    mesh; else put on the sampler's mesh by the same sharding rules (jax.device_put)."""
    if self.rollout_mesh is None or self.rollout_mesh is self.mesh:
      return params
    return jax.device_put(params, shardings(params, self.rollout_mesh))


def state_jit_options(state, run: Run) -> dict:
  """Donate the state; on a mesh, keep its layout (so the next step compiles nothing new)."""
  options = dict(donate_argnums=0)
  if run.mesh is not None:
    options["out_shardings"] = (shardings(state, run.mesh), None)
  return options
