"""From a rollout and its rewards to the update's `Batch`: old, reference and rollout log-probs,
old values, shaped rewards, advantages and returns: a pure function that the RL step
(grpo_jax/train/learner/step.py) jits together with the update. Its maths, after the forward passes,
is `prepare_from_logprobs`, a public function of arrays alone.

When `reuses_current_logprobs(rl)` holds (one pass, one minibatch, nothing before the update
needs them), the old log-probs are not computed here: they equal the policy's log-probs at the
update, which the update then uses (stop-gradient) itself, saving one forward pass."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.value_head import separate_critic_values
from grpo_jax.rl import advantages as adv_lib
from grpo_jax.rl.aggregation import masked_mean
from grpo_jax.rl.corrections import correction_metrics, make_correction
from grpo_jax.rl.distill import distilled_advantages, reverse_kl_per_token
from grpo_jax.rl.estimators import make_estimator
from grpo_jax.rl.kl import kl_penalty
from grpo_jax.rl.losses import truncated_is_weights
from grpo_jax.rl.shaping import overlong_penalty
from grpo_jax.train.learner.forward import policy_and_values, prompt_group
from grpo_jax.train.learner.state import policy_params, reference_params


class RewardInputs(NamedTuple):
  """What the host's reward side hands the step, per completion row (B rows)."""
  rewards: jax.Array  # (B,) outcome rewards
  # Only the inputs rl.advantage's estimator `needs` (grpo_jax/rl/estimators.py), by name:
  # {} for most; {"greedy_rewards": (B,)} for ReMax; {"step_rewards": (3 x (B, K))} for
  # process supervision.
  extras: dict
  prompts_consumed: jax.Array  # int32 (): prompts of the data stream this step's rows used


class Batch(NamedTuple):
  """What the update consumes; every array has the batch dimension B first. A field that a
  config does not need is None (never zeros that mean "absent")."""
  prompt_tokens: jax.Array  # (B, P)
  prompt_mask: jax.Array  # (B, P)
  completion_tokens: jax.Array  # (B, N)
  completion_mask: jax.Array  # (B, N) the tokens that exist
  loss_mask: jax.Array  # (B, N) the tokens that carry loss (mask_truncated may drop rows)
  advantages: jax.Array  # (B, N)
  sampler_logprobs: jax.Array  # (B, N) the sampler's log-probs (Rollout.logprobs)
  # Policy before the update; None when the update reuses its own (reuses_current_logprobs).
  old_logprobs: jax.Array | None = None
  ref_logprobs: jax.Array | None = None  # frozen reference; None when rl.kl_coef == 0
  old_values: jax.Array | None = None  # (B, N) critic at rollout time; None without one
  returns: jax.Array | None = None  # (B, N) value targets; None without a critic
  # Importance weights (rl.tis_cap's or rl.is_correction's); None when off, or when the update
  # computes them itself.
  is_weights: jax.Array | None = None
  # (B,) the outcome rewards before any shaping; for objectives that read them (rl/drpo.py).
  outcome_rewards: jax.Array | None = None
  # (B, N) the distillation teacher's log-probs of the sampled tokens, for its loss term
  # (rl.distill_in = "loss"); None otherwise (grpo_jax/rl/distill.py).
  teacher_logprobs: jax.Array | None = None
  # (B, N) the keep-sampling mask's cutoffs (Rollout.keep_cutoff); None when off. With it, every
  # log-prob of the update is of its policy renormalised over the sampler's kept tokens
  # (models/scoring.py), sampler_logprobs included.
  keep_cutoff: jax.Array | None = None
  # (B, P + N, L, k) a mixture's routing as the sampler chose it (Rollout.routes); None for a
  # dense model. The update replays it under rl.routing_replay = "rollout", and measures its
  # own routing against it (`routing_mismatch`).
  routes: jax.Array | None = None
  # (B, N) the policy's own tokens (Rollout.action_mask within the completion): where the
  # update measures the rollout's KL and sampler gap when it reuses its log-probs. A
  # multi-turn episode's environment tokens are completion tokens but not actions.
  action_mask: jax.Array | None = None
  # (B, patches, dim) each row's image (Rollout.images) for a vision-language policy; None for
  # text: the update's and the reference's passes see the image the sampler saw.
  images: jax.Array | None = None


def reuses_current_logprobs(rl) -> bool:
  """True when the old log-probs need no forward pass of their own: with mu = 1 pass and one
  minibatch the update's only gradient step runs at the params that sampled the batch, so the
  old log-probs equal the update's own log-probs (TRL does the same). The update then uses
  stop_gradient(logp) as old log-probs (ratio exactly 1) and computes what else needs them
  (truncated IS weights, `rollout_kl`, `sampler_logprob_gap`). Not when the KL sits in the
  reward (the advantages need it before the update) nor with a shared value head (its old
  values need the policy's forward pass anyway); rl.reuse_old_logprobs = False turns it off."""
  return bool(rl.reuse_old_logprobs and rl.num_iterations == 1
              and rl.num_minibatches == 1 and not (rl.kl_in == "reward" and rl.kl_coef > 0)
              and rl.value_head != "shared")


def in_row_chunks(fn, rows_tree, pieces: int):
  """fn(rows_tree) computed `pieces` rows-chunks at a time (jax.lax.map), outputs joined back
  along the rows; fn itself when pieces == 1."""
  if pieces == 1:
    return fn(rows_tree)
  split = jax.tree.map(lambda x: x.reshape(pieces, -1, *x.shape[1:]), rows_tree)
  out = jax.lax.map(fn, split)
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)


def make_prepare_batch(model_cfg: ModelConfig, rl, group_size: int, temperature: float,
                       max_new_tokens: int, token_capacity: int | None = None):
  """prepare(state, rollout, inputs: RewardInputs) -> (Batch, metrics), a pure function (the RL
  step jits it with the rest). token_capacity: the forward passes' completion tokens packed
  into that many slots per piece of a micro-batch's rows (rl.pack_tokens, models/packing.py);
  the passes then take the rows in micro-batch-sized pieces, which the capacity bounds."""

  reuse = reuses_current_logprobs(rl)
  group = prompt_group(rl, group_size)
  # The pieces the forward passes take the rows in: packed, or in the memory mode of a large
  # vocabulary (model.logits_chunk > 0), the update's micro-batches (num_minibatches x
  # num_micro_batches pieces), so that preparation needs no more memory than the update; else
  # 1 (one pass over all rows).
  passes = (rl.num_minibatches * rl.num_micro_batches
            if token_capacity or model_cfg.logits_chunk else 1)

  def prepare(state, rollout, inputs: RewardInputs):
    mask = rollout.completion_mask.astype(bool)
    if reuse:  # the update computes the old log-probs (see reuses_current_logprobs)
      old_logp, old_values, routing = None, None, {}
      if rl.value_head == "separate":
        old_values = jnp.where(mask, in_row_chunks(lambda r: separate_critic_values(
            state.value_params, model_cfg, r.prompt_tokens, r.prompt_mask,
            r.completion_tokens, r.completion_mask.astype(bool)), rollout, passes), 0.0)
    else:
      old_logp, _, old_values, routing = in_row_chunks(lambda r: policy_and_values(
          policy_params(state), state.value_params, r, model_cfg, rl.value_head, temperature,
          group, token_capacity, rl.routing_replay), rollout, passes)
      old_logp = jax.lax.stop_gradient(old_logp)
    ref_logp = None
    if rl.kl_coef > 0:  # the reference routes by its own router
      ref_logp = in_row_chunks(lambda r: policy_and_values(
          reference_params(state), None, r, model_cfg, "none", temperature, group,
          token_capacity)[0], rollout, passes)
    return prepare_from_logprobs(rl, group_size, max_new_tokens, rollout, inputs,
                                 old_logp=old_logp, ref_logp=ref_logp, old_values=old_values,
                                 kl_coef=state.kl_coef, routing=routing)

  return prepare


def prepare_from_logprobs(rl, group_size: int, max_new_tokens: int, rollout,
                          inputs: RewardInputs, *, old_logp, ref_logp, old_values, kl_coef,
                          routing=None):
  """The preparation between a rollout and the update, from arrays alone (no model call): a
  pure function that peers' code can be checked against with log-probs, values and rewards
  made up. Returns (Batch, metrics).

    r_i        = outcome reward (+ overlong penalty when rl.overlong_buffer > 0, counted to
                 `max_new_tokens`, the longest completion: config.completion_cap)
    r_{i,t}    = r_i on the last completion token, 0 elsewhere
                 (- kl_coef * KL_t(old || ref) when rl.kl_in == "reward")
    A, R       = rl.advantage's estimator of r_{i,t} (with old values for GAE)
    actions    = the policy's own tokens (Rollout.action_mask): the KL, the importance
                 weights and the loss are taken on these alone
    loss mask  = actions, less truncated rows under rl.mask_truncated
    IS weights = truncated importance weights old / sampler, capped at rl.tis_cap (> 0), or
                 rl.is_correction's of the sampler (behaviour) and old (proximal) log-probs
                 (grpo_jax/rl/corrections.py, with its metrics)

  old_logp None: the update reuses its own log-probs (reuses_current_logprobs); ref_logp None
  without a KL reference; old_values None without a critic."""
  routing = routing or {}
  reuse = old_logp is None
  critic = rl.value_head != "none"
  mask = rollout.completion_mask.astype(bool)
  estimate = make_estimator(rl)
  rewards = inputs.rewards.astype(jnp.float32)
  if rl.overlong_buffer > 0:
    rewards = rewards + overlong_penalty(jnp.sum(mask, axis=1), max_new_tokens,
                                         rl.overlong_buffer, rl.overlong_penalty)
  token_rewards = adv_lib.place_reward_on_last_token(rewards, mask)
  # The policy's own tokens (Rollout.action_mask): a multi-turn episode's environment and tool
  # tokens condition the policy but carry no loss, KL, entropy or importance weight.
  actions = rollout.action_mask.astype(bool) & mask
  if not reuse:
    kl = kl_penalty(old_logp, old_logp if ref_logp is None else ref_logp, actions,
                    rl.kl_estimator, rl.kl_clamp or None)
    if rl.kl_in == "reward" and rl.kl_coef > 0:
      token_rewards = token_rewards - kl_coef * kl
  advantages, returns = estimate(group_size, token_rewards, mask, old_values, inputs.extras)
  # The loss is taken on the policy's actions, less truncated rows under rl.mask_truncated.
  loss_mask = actions & ~rollout.truncated[:, None] if rl.mask_truncated else actions
  sampler_logp = rollout.logprobs
  if rollout.kept_logmass is not None:  # the sampler's policy renormalised over its kept set
    sampler_logp = sampler_logp - rollout.kept_logmass
  teacher_logp = inputs.extras.get("teacher_logprobs")
  distill = teacher_logp is not None and rl.distill_coef > 0
  if distill:
    teacher_logp = jnp.where(mask, teacher_logp.astype(jnp.float32), 0.0)
    if rl.distill_in == "reward":
      advantages = distilled_advantages(advantages, sampler_logp, teacher_logp, mask,
                                        rl.distill_coef)
  is_weights, correct, correction = None, make_correction(rl), {}
  if rl.tis_cap > 0 and not reuse:
    is_weights = truncated_is_weights(old_logp, sampler_logp, actions, rl.tis_cap)
  if correct is not None and not reuse:  # otherwise the update computes them
    is_weights, sums = correct(sampler_logp, old_logp, actions)
    correction = correction_metrics(sums)
  batch = Batch(rollout.prompt_tokens, rollout.prompt_mask, rollout.completion_tokens, mask,
                loss_mask, jnp.where(mask, advantages, 0.0),
                jnp.where(mask, sampler_logp, 0.0), old_logprobs=old_logp,
                ref_logprobs=ref_logp, old_values=old_values,
                returns=jnp.where(mask, returns, 0.0) if critic else None,
                is_weights=is_weights, outcome_rewards=inputs.rewards.astype(jnp.float32),
                keep_cutoff=rollout.keep_cutoff, routes=rollout.routes,
                teacher_logprobs=teacher_logp if distill and rl.distill_in == "loss" else None,
                action_mask=actions, images=rollout.images)
  metrics = dict(shaped_reward_mean=jnp.mean(rewards),
                 advantage_abs_mean=masked_mean(jnp.abs(advantages), mask), **correction)
  if distill:  # the sampling policy's reverse KL to the teacher, per completion token
    metrics["distill_reverse_kl"] = masked_mean(
        reverse_kl_per_token(sampler_logp, teacher_logp, mask), mask)
  if not reuse:  # otherwise the update reports these two
    metrics.update(rollout_kl=masked_mean(kl, actions), sampler_logprob_gap=masked_mean(
        jnp.abs(old_logp - sampler_logp), actions))
  if not reuse and "routed" in routing:  # otherwise the update reports it
    metrics["routing_mismatch"] = (jnp.sum(routing["mismatched"]) /
                                   jnp.maximum(jnp.sum(routing["routed"]), 1.0))
  if rollout.kept_logmass is not None:  # the probability mass top-k / top-p cut away
    metrics["keep_truncated_mass"] = masked_mean(1.0 - jnp.exp(rollout.kept_logmass), mask)
  if old_values is not None:
    metrics["value_mean"] = masked_mean(old_values, mask)
  return batch, metrics
