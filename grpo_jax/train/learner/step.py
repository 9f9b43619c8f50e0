"""The RL step: one pure function `rl_step(state, rollout, reward_inputs) -> (state, metrics)`.

Everything a step does on the devices, in order:

  1. prepare   rewards (+ overlong shaping) -> token rewards (- beta * KL if the KL is in the
               reward) -> advantages and returns (the registered estimator, rl.advantage);
               old / reference log-probs and old values where the config needs them
               (grpo_jax/train/learner/experience.py)
  2. update    mu = rl.num_iterations passes in rl.num_minibatches shuffled minibatches, each
               one optimizer step on the summed gradients of its micro-batches; the registered
               policy loss (rl.loss), KL, entropy and value terms; a non-finite loss or gradient
               leaves params and optimizer state unchanged (grpo_jax/train/learner/update.py)
  3. end       adaptive KL coefficient, reference refresh (grpo_jax/train/learner/state.py)

The step learns; it reads no data position and draws no rollout: those belong to the
experience source (grpo_jax/train/sources/experience_source.py, SourceState).

The learner (grpo_jax/train/stages/rl_advance.py) jits it once with the state donated; several seeds are
`SeedAxis.compile(rl_step)` (vmap or lax.map over stacked states); the fused source
(grpo_jax/train/sources/fused.py) calls it inside a lax.scan after an on-device rollout and reward.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_jax.models.config import ModelConfig
from grpo_jax.train.learner.experience import RewardInputs, make_prepare_batch
from grpo_jax.train.learner.state import TrainState, end_of_step
from grpo_jax.train.learner.update import make_update


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """What the step's maths depends on, besides the state and the data."""
  model_cfg: ModelConfig
  rl: Any  # the config's rl section, read at trace time
  optimizer: Any  # optax.GradientTransformation
  group_size: int
  temperature: float  # the sampler's: log-probs are of the tempered policy
  max_new_tokens: int
  # The forward passes' completion tokens packed into this many slots per micro-batch
  # (rl.pack_tokens; models/packing.py); None: every slot of every row.
  token_capacity: int | None = None


def make_rl_step(spec: StepSpec):
  """rl_step(state, rollout, reward_inputs) -> (state, metrics), pure and un-jitted; rollout:
  what a source produced, a rollout/types.py Rollout (the learner reads its fields and never
  imports the sampler's package)."""
  prepare = make_prepare_batch(spec.model_cfg, spec.rl, spec.group_size, spec.temperature,
                               spec.max_new_tokens, spec.token_capacity)
  update = make_update(spec.model_cfg, spec.rl, spec.optimizer, spec.temperature,
                       spec.group_size, spec.token_capacity)

  def rl_step(state: TrainState, rollout, reward_inputs: RewardInputs):
    batch, prep_metrics = prepare(state, rollout, reward_inputs)
    state, metrics = update(state, batch)
    metrics = {**metrics, **prep_metrics}
    # rollout_kl (old policy vs reference) comes from preparation, or from the update when it
    # reuses its own log-probs as the old ones.
    state = end_of_step(state, spec.rl, metrics["rollout_kl"],
                        batch_size=rollout.completion_tokens.shape[0])
    metrics["kl_coef"] = state.kl_coef
    return state, metrics

  return rl_step
