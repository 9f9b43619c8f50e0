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
(or `pipelines`: it runs the config's rl.max_staleness, train/sources/pipeline.py)
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
import time
from typing import Callable, NamedTuple, Optional

import jax
from jax.sharding import Mesh

from grpo_jax.data.task import Task
from grpo_jax.models.partitioning import shardings
from grpo_jax.registry import Registry
from grpo_jax.rewards.estimator_inputs import step_needs
from grpo_jax.rewards.sources import RewardSources
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.rollout.types import Rollout
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.run.seed_axis import SeedAxis
from grpo_jax.train.sources.pipeline import copy_params
from grpo_jax.train.learner.step import StepSpec


@dataclasses.dataclass(frozen=True)
class ExperienceSource:
  make: Callable  # make(run, state, samples_out) -> next_experience (or advance: owns_step)
  max_staleness: int = 0  # updates a row may lag the learner by; 0 = on-policy
  owns_step: bool = False  # make returns advance(run_state): the source runs the RL step
  pipelines: bool = False  # it runs rl.max_staleness > 0 (train/sources/pipeline.py)

  def staleness(self, rl) -> int:
    """The staleness its rows may have in a run of this rl section: rl.max_staleness for a
    source that pipelines, else its declared max_staleness."""
    return int(rl.get("max_staleness", 0)) if self.pipelines else self.max_staleness


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
                               replace: bool = False, pipelines: bool = False):
  """Decorator: registers make(run, state, samples_out) as the source `name`."""
  def add(make):
    EXPERIENCE_SOURCES.register(name, ExperienceSource(make, max_staleness, owns_step,
                                                       pipelines), replace=replace)
    return make
  return add


def source_name(train_cfg) -> str:
  """The run's source: train.experience_source, or by train.fused_steps when it is ""."""
  name = train_cfg.experience_source
  return name or ("fused" if train_cfg.fused_steps else "host")


def for_source(rl, train_cfg):
  """The rl section the step runs with: reuse_old_logprobs off for a source whose rows may be
  stale (the same section otherwise)."""
  if not EXPERIENCE_SOURCES.get(source_name(train_cfg)).staleness(rl) or not rl.get(
      "reuse_old_logprobs", True):
    return rl
  rl = rl.copy_and_resolve_references()
  rl.reuse_old_logprobs = False
  return rl


@dataclasses.dataclass(frozen=True)
class SourceSettings:
  """The config as the sources read it (rollout, rl, train and data fields), a frozen section
  built once from the validated config (`of`): no source walks the config itself."""
  name: str  # the source (source_name)
  num_prompts: int  # rollout.num_prompts: prompts a step learns from
  group_size: int  # rollout.group_size: completions sampled per prompt (G')
  gfpo_keep: int = 0  # rl.gfpo_keep: the k of G' a step keeps (0: all)
  gfpo_metric: str = "length"
  dynamic_sampling: bool = False  # rl.dynamic_sampling, and its rl.max_extra_rollouts
  max_extra_rollouts: int = 0
  prompt_bucket: int = 0  # data.prompt_bucket
  on_reward_error: str = "raise"  # train.on_reward_error, train.max_reward_error_fraction
  max_reward_error_fraction: float = 1.0
  steps: int = 0  # train.steps, train.fused_steps, and when samples are written
  fused_steps: int = 0
  eval_every: int = 0
  samples_every: int = 0
  num_samples: int = 0

  @property
  def update_group_size(self) -> int:
    """Completions per prompt in the update: rollout.group_size, or GFPO's kept rl.gfpo_keep."""
    return self.gfpo_keep or self.group_size

  @classmethod
  def of(cls, config) -> "SourceSettings":
    r, rl, t = config.rollout, config.rl, config.train
    return cls(source_name(t), r.num_prompts, r.group_size, rl.gfpo_keep, rl.gfpo_metric,
               rl.dynamic_sampling, rl.max_extra_rollouts,
               config.data.prompt_bucket if "data" in config else 0,  # (tests' bare configs)
               t.on_reward_error, t.max_reward_error_fraction, t.steps, t.fused_steps,
               t.eval_every, t.samples_every, t.num_samples)


@dataclasses.dataclass(frozen=True)
class Run:
  """What a source and the learner's advance need besides the state, built once by the RL
  stage (train/stages/rl.py `Run.of`): typed sections, not the config."""
  settings: SourceSettings
  axis: SeedAxis
  task: Task
  spec: StepSpec  # the learner's section (its model, rl section, optimizer)
  base_keys: tuple  # per seed: jax.random.key(seed)
  workdirs: tuple  # per seed: where its records go
  mesh: Optional[Mesh]  # the learner's, or None (stacked seeds run on one device)
  log: Callable[[str], None]
  sources: RewardSources = RewardSources()  # the rewards and how they combine
  rollout_mesh: Optional[Mesh] = None  # the sampler's mesh; None: the learner's
  sampling: Optional[Sampling] = None  # one row per prompt (its greedy() decodes baselines)
  rollout: Optional[Sampling] = None  # the training rollout's: G rows per prompt
  needs: tuple = ()  # what the estimator needs beyond rewards (rewards/estimator_inputs.py)

  @classmethod
  def of(cls, config, axis, task, spec, base_keys, workdirs, mesh, log,
         sources=RewardSources(), rollout_mesh=None) -> "Run":
    r = config.rollout
    sampling = Sampling.of(spec.model_cfg, task, r, mesh if rollout_mesh is None else
                           rollout_mesh)
    rollout = sampling.grouped(r.group_size, config.rl.keep_sampling_mask,
                               record_routes=True).quantized(r.weight_dtype)
    return cls(SourceSettings.of(config), axis, task, spec, base_keys, workdirs, mesh, log,
               sources, rollout_mesh, sampling, rollout, step_needs(config))

  @property
  def sampler_mesh(self):
    return self.mesh if self.rollout_mesh is None else self.rollout_mesh

  def sync_weights(self, params):
    """The learner's params as the sampler takes them: themselves when both roles share one
    mesh; else put on the sampler's mesh by the same sharding rules (jax.device_put)."""
    if self.rollout_mesh is None or self.rollout_mesh is self.mesh:
      return params
    return jax.device_put(params, shardings(params, self.rollout_mesh))

  def sync_weights_timed(self, params, copy: bool = False):
    """(sync_weights(params), {"weight_sync_bytes", "weight_sync_s"}): the bytes moved (every
    leaf's size x itemsize; 0 when both roles share one mesh, unless `copy`: then a device copy
    in new buffers) and the seconds from the params being ready on the learner's devices to
    their copy being ready on the sampler's (block_until_ready on both sides, so the update's
    own time is not counted)."""
    shared = self.rollout_mesh is None or self.rollout_mesh is self.mesh
    if shared and not copy:
      return params, {"weight_sync_bytes": 0, "weight_sync_s": 0.0}
    jax.block_until_ready(params)
    started = time.perf_counter()
    synced = jax.block_until_ready(copy_params(params) if shared else self.sync_weights(params))
    seconds = time.perf_counter() - started
    moved = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    return synced, {"weight_sync_bytes": int(moved), "weight_sync_s": seconds}


def state_jit_options(state, run: Run) -> dict:
  """Donate the state; on a mesh, keep its layout (so the next step compiles nothing new)."""
  options = dict(donate_argnums=0)
  if run.mesh is not None:
    options["out_shardings"] = (shardings(state, run.mesh), None)
  return options
