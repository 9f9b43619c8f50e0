"""The one state pytree of a run, and the optimizer that updates it."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from grpo_jax.models.lora import LoraParams
from grpo_jax.rl.kl import adaptive_kl_coef
from grpo_jax.rl.lr_schedules import LR_SCHEDULES
from grpo_jax.train.learner import skips


class TrainState(flax.struct.PyTreeNode):
  """Everything a run needs to continue: checkpoint it, shard it or vmap it whole.

  step: updates done (the policy's version); key: the run's base key (per-step keys are
  fold_in(key, step), so the randomness of step s does not depend on how the run got there).
  Where the data stands and which rollout comes next belong to the experience source
  (`SourceState`), not to the learner.

  Under LoRA (config.lora.rank > 0) `params` holds the trainable adapters only and
  `base_params` the frozen base weights, which are also the reference (no copy: ref_params is
  None); `policy_params` / `reference_params` give what the forward passes take either way.
  base_params is not checkpointed: it is rebuilt from model.path (and the warm-up) on resume.
  """
  step: jax.Array
  params: Any  # the policy's trainable params: all of them, or the LoRA adapters
  value_params: Any  # critic head (+ backbone for a separate critic), or None
  opt_state: Any  # of the pair (params, value_params)
  ref_params: Any  # frozen reference; None under LoRA (the base is the reference) and when
  # rl.kl_coef == 0 (nothing reads it)
  kl_coef: jax.Array  # beta (moves under the adaptive controller)
  key: jax.Array
  skipped_updates: jax.Array  # updates refused for a non-finite loss or gradient
  consecutive_skips: jax.Array  # ... of which the latest in a row (0 after an applied one)
  # optimizer steps left out because their gradient was exactly zero (rl.skip_without_signal;
  # learner/skips.py): params, moments and count unchanged
  no_signal_updates: jax.Array
  base_params: Any = None  # LoRA's frozen base weights; None for full fine-tuning


def policy_params(state: TrainState):
  """What the policy's forward takes: params, or LoraParams(base, adapters) under LoRA."""
  if state.base_params is None:
    return state.params
  return LoraParams(state.base_params, state.params)


def reference_params(state: TrainState):
  """The KL reference's params: the frozen copy when there is one, else under LoRA the base
  (adapters off; a stage whose reference moves, Iterative RPO's rounds, keeps a merged copy)."""
  return state.ref_params if state.ref_params is not None else state.base_params


def make_optimizer(optim_cfg, total_updates: int) -> optax.GradientTransformation:
  """AdamW after global-norm clipping, its rate from LR_SCHEDULES[optim.schedule]: a linear
  warm-up to the peak (none for optim.warmup_steps 0: the peak at the first update), then
  constant or decaying over `total_updates` (the count advances only at an applied update: a
  step without signal leaves it, learner/skips.py)."""
  make = LR_SCHEDULES[getattr(optim_cfg, "schedule", "constant")]
  peak = optim_cfg.learning_rate
  schedule = make(peak, optim_cfg.warmup_steps, total_updates,
                  peak * getattr(optim_cfg, "final_lr_fraction", 0.0))
  return optax.chain(
      optax.clip_by_global_norm(optim_cfg.max_grad_norm),
      optax.adamw(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2,
                  weight_decay=optim_cfg.weight_decay))


def create_train_state(params, optimizer: optax.GradientTransformation, key,
                       value_params=None, kl_coef: float = 0.0,
                       base_params=None) -> TrainState:
  """A fresh state whose frozen reference is a copy of the starting policy; with
  `base_params` (LoRA: params are then the adapters) the reference is that base, uncopied;
  with kl_coef 0 there is none (no KL term reads it, and a copy of the weights is saved)."""
  ref = jax.tree.map(jnp.copy, params) if base_params is None and kl_coef > 0 else None
  return TrainState(step=jnp.int32(0), params=params, value_params=value_params,
                    opt_state=optimizer.init((params, value_params)), ref_params=ref,
                    kl_coef=jnp.float32(kl_coef), key=key,
                    skipped_updates=jnp.int32(0), consecutive_skips=jnp.int32(0),
                    no_signal_updates=jnp.int32(0), base_params=base_params)


class SourceState(flax.struct.PyTreeNode):
  """What an experience source owns, checkpointed in the same step as the learner's state.

  key: the run's base key (the same as TrainState.key); data_position: training prompts
  consumed; rollouts: rollouts drawn (the rollout-key counter: rollout r samples with
  fold_in(fold_in(key, r), 0), so a token's randomness depends on the rollout's number, never
  on timing); in_flight: experience sampled but not yet learned from (a source's own pytree;
  None for the on-policy sources)."""
  key: jax.Array
  data_position: jax.Array
  rollouts: jax.Array
  in_flight: Any = None


def create_source_state(key, in_flight=None) -> SourceState:
  """A fresh source state: position 0, no rollout drawn; `key` copied (the learner's state,
  which may hold the same key, is donated to its step); `in_flight` the source's own."""
  return SourceState(key=jax.random.clone(key), data_position=jnp.int32(0),
                     rollouts=jnp.int32(0), in_flight=in_flight)


class RunState(flax.struct.PyTreeNode):
  """The RL loop's state: the learner's and the source's, checkpointed together."""
  train: TrainState
  source: SourceState

  @property
  def step(self):
    return self.train.step


def step_key(state: TrainState, purpose: int) -> jax.Array:
  """The key for one purpose (1 update) of the current step."""
  return jax.random.fold_in(jax.random.fold_in(state.key, state.step), purpose)


def rollout_key(source: SourceState) -> jax.Array:
  """The key of the source's next rollout: fold_in(fold_in(key, rollouts), 0) (what
  step_key(state, 0) was while the learner counted the rollouts)."""
  return jax.random.fold_in(jax.random.fold_in(source.key, source.rollouts), 0)


def guarded_update(state: TrainState, grads, loss, optimizer) -> TrainState:
  """One optimizer step of the policy's params (`guarded_apply`: none if the loss or any gradient
  is not finite), the step counted and a refused update counted as skipped, in all and in a row
  (`counted_skips`): the update of the SFT, reward-model and preference stages."""
  (params, _), opt_state, finite, _ = guarded_apply(
      (state.params, None), state.opt_state, (grads, None), loss, optimizer)
  return counted_skips(state, finite).replace(step=state.step + 1, params=params,
                                              opt_state=opt_state)


def counted_skips(state: TrainState, applied) -> TrainState:
  """`state` with an update that was `applied` (or refused) counted: skipped_updates + 1 and
  consecutive_skips + 1 when refused, consecutive_skips 0 when applied (what the stages' loop
  stops on: faults.check_skips)."""
  return state.replace(
      skipped_updates=state.skipped_updates + (~applied).astype(jnp.int32),
      consecutive_skips=jnp.where(applied, 0, state.consecutive_skips + 1).astype(jnp.int32))


def guarded_apply(params, opt_state, grads, loss, optimizer, *, skip_without_signal=False):
  """One optimizer step, or no change at all (params, moments, count) when it is refused:
  always if the loss or any gradient is not finite; with `skip_without_signal` also if every
  gradient is exactly zero (the rule of learner/skips.py).

  Returns (params, opt_state, finite, signal): bool arrays; the step applied iff both hold
  (signal is True when the rule is off).
  """
  finite = jnp.isfinite(loss) & jnp.all(jnp.array(
      [jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
  signal = ~skips.skip_without_signal(grads)[0] if skip_without_signal else jnp.bool_(True)

  def step(params, opt_state):
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt_state

  # A branch, not where(finite, new, old) over every leaf: the select keeps the old and the new
  # params and both AdamW moments alive at once (3 param-sized copies of scratch, 0.9 GiB of
  # the 0.5B step's); the branch updates them in place. (Under a vmap over seeds the cond
  # becomes that select again.)
  # The rules are optax's ShouldSkipUpdateFunctions, but the guard is not optax.MultiSteps (a
  # wrapper whose updates are applied outside it): the params' add would then no longer fuse
  # with AdamW's update, which moves the params by one float32 ulp in places (measured: 6e-8
  # after one step of tests/test_update.py's batch), so runs would no longer reproduce earlier
  # ones bit for bit. tests/test_skips.py checks the guard against MultiSteps.
  params, opt_state = jax.lax.cond(finite & signal, step, lambda p, o: (p, o), params,
                                   opt_state)
  return params, opt_state, finite, signal


def end_of_step(state: TrainState, rl, rollout_kl, batch_size: int) -> TrainState:
  """After an update: the adaptive KL controller and the reference refresh.

  adaptive:  beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * B / horizon)
             (unchanged when the KL is not finite)
  refresh:   every rl.ref_update_every steps, ref <- mix * policy + (1 - mix) * ref
  """
  if rl.adaptive_kl:
    beta = adaptive_kl_coef(state.kl_coef, rollout_kl, rl.kl_target, rl.kl_horizon, batch_size)
    state = state.replace(kl_coef=jnp.where(jnp.isfinite(beta), beta, state.kl_coef))
  if rl.ref_update_every > 0 and state.ref_params is not None:  # (none under LoRA)
    refresh = state.step % rl.ref_update_every == 0
    mix = rl.ref_mix
    state = state.replace(ref_params=jax.tree.map(
        lambda p, r: jnp.where(refresh, mix * p + (1.0 - mix) * r, r), state.params,
        state.ref_params))
  return state
