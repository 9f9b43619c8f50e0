"""From a rollout and its rewards to the update's `Batch`: old, reference and rollout log-probs,
old values, shaped rewards, advantages and returns. One jitted program per config.

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
from grpo_jax.rl import token_advantages as tok_adv
from grpo_jax.rl.aggregation import masked_mean
from grpo_jax.rl.kl import kl_penalty
from grpo_jax.rl.losses import truncated_is_weights
from grpo_jax.rl.shaping import overlong_penalty
from grpo_jax.rollout.sampler import Rollout
from grpo_jax.train.forward import policy_and_values


class RewardInputs(NamedTuple):
  """What the reward side hands over, per completion row (B rows)."""
  rewards: jax.Array  # (B,) outcome rewards
  greedy_rewards: jax.Array  # (B,) reward of the greedy completion of the row's prompt (remax)
  step_rewards: jax.Array  # (B, K) process rewards ("process" estimator), else zeros
  step_end_index: jax.Array  # (B, K) int: token index where each step ends
  step_mask: jax.Array  # (B, K) bool


class Batch(NamedTuple):
  """What the update consumes; every array has the batch dimension B first."""
  prompt_tokens: jax.Array  # (B, P)
  prompt_mask: jax.Array  # (B, P)
  completion_tokens: jax.Array  # (B, N)
  completion_mask: jax.Array  # (B, N) the tokens that exist
  loss_mask: jax.Array  # (B, N) the tokens that carry loss (mask_truncated may drop rows)
  # When the update reuses its own log-probs (`reuses_current_logprobs`), old_logprobs is zeros,
  # ref_logprobs too if rl.kl_coef == 0, and is_weights ones: the update derives them from
  # stop_gradient(logp) and sampler_logprobs itself.
  old_logprobs: jax.Array  # (B, N) policy before the update (recomputed by the trainer)
  ref_logprobs: jax.Array  # (B, N) frozen reference (the old log-probs when rl.kl_coef == 0)
  advantages: jax.Array  # (B, N)
  old_values: jax.Array  # (B, N) critic at rollout time (zeros without one)
  returns: jax.Array  # (B, N) value targets (zeros without a critic)
  is_weights: jax.Array  # (B, N) truncated importance weights (ones when off)
  sampler_logprobs: jax.Array  # (B, N) the sampler's log-probs (Rollout.logprobs)


def reuses_current_logprobs(rl) -> bool:
  """True when the old log-probs need no forward pass of their own: with mu = 1 pass and one
  minibatch the update's only gradient step runs at the params that sampled the batch, so the
  old log-probs equal the update's own log-probs (TRL does the same). The update then uses
  stop_gradient(logp) as old log-probs (ratio exactly 1) and computes what else needs them
  (truncated IS weights, `rollout_kl`, `sampler_logprob_gap`). Not when the KL sits in the
  reward (the advantages need it before the update) nor with a shared value head (its old
  values need the policy's forward pass anyway); rl.reuse_old_logprobs = False turns it off."""
  return bool(rl.get("reuse_old_logprobs", True) and rl.num_iterations == 1
              and rl.num_minibatches == 1 and not (rl.kl_in == "reward" and rl.kl_coef > 0)
              and rl.value_head != "shared")


def step_rollout_kl(prep_metrics: dict, update_metrics: dict):
  """The step's rollout KL (old policy vs reference, for the adaptive KL controller): from
  preparation, or from the update where it reuses its own log-probs as the old ones."""
  return prep_metrics["rollout_kl"] if "rollout_kl" in prep_metrics else update_metrics[
      "rollout_kl"]


def estimate_advantages(rl, group_size: int, token_rewards, mask, values, inputs: RewardInputs):
  """Dispatches config.rl.advantage; returns (advantages (B, N), returns (B, N))."""
  seq_rewards = jnp.sum(token_rewards, axis=1)  # outcome reward minus any in-reward KL
  name, eps = rl.advantage, rl.advantage_eps
  if name == "gae":
    return tok_adv.gae_advantages(token_rewards, values, mask, rl.gamma, rl.lam,
                                  whiten=rl.whiten_advantages)
  if name in ("grpo", "dr_grpo"):
    adv = adv_lib.broadcast_to_tokens(
        adv_lib.group_normalized_advantages(seq_rewards, group_size, eps, name == "grpo"), mask)
  elif name == "grpo_batch_std":
    adv = adv_lib.grpo_batch_std_advantages(seq_rewards, group_size, mask, eps)
  elif name == "rloo":
    adv = adv_lib.rloo_advantages(seq_rewards, group_size, mask)
  elif name == "reinforce_pp":
    adv = tok_adv.reinforce_pp_advantages(token_rewards, mask, rl.gamma)
  elif name == "reinforce_pp_baseline":
    adv = adv_lib.reinforce_pp_baseline_advantages(seq_rewards, group_size, mask)
  elif name == "remax":
    adv = adv_lib.remax_advantages(seq_rewards, inputs.greedy_rewards, mask)
  elif name == "process":
    adv = tok_adv.process_advantages(inputs.step_rewards, inputs.step_end_index,
                                     inputs.step_mask, group_size, mask, eps)
  else:
    raise ValueError(f"rl.advantage={name!r} is unknown.")
  # A critic next to a critic-free estimator still learns Monte-Carlo returns.
  return adv, tok_adv.discounted_returns(token_rewards, mask, rl.gamma)


def make_prepare_batch(model_cfg: ModelConfig, rl, group_size: int, temperature: float,
                       max_new_tokens: int):
  """Jitted prepare(params, value_params, ref_params, kl_coef, rollout, inputs) ->
  (Batch, metrics)."""

  reuse = reuses_current_logprobs(rl)

  @jax.jit
  def prepare(params, value_params, ref_params, kl_coef, rollout: Rollout,
              inputs: RewardInputs):
    mask = rollout.completion_mask.astype(bool)
    if reuse:  # the update computes the old log-probs (see reuses_current_logprobs)
      old_logp = None
      old_values = None
      if rl.value_head == "separate":
        old_values = jnp.where(mask, separate_critic_values(
            value_params, model_cfg, rollout.prompt_tokens, rollout.prompt_mask,
            rollout.completion_tokens, mask), 0.0)
    else:
      old_logp, _, old_values = policy_and_values(params, value_params, rollout, model_cfg,
                                                  rl.value_head, temperature)
      old_logp = jax.lax.stop_gradient(old_logp)
    zeros = jnp.zeros(mask.shape, jnp.float32)
    if rl.kl_coef > 0:
      ref_logp, _, _ = policy_and_values(ref_params, None, rollout, model_cfg, "none",
                                         temperature)
    else:
      ref_logp = zeros if reuse else old_logp
    rewards = inputs.rewards.astype(jnp.float32)
    if rl.overlong_buffer > 0:
      rewards = rewards + overlong_penalty(jnp.sum(mask, axis=1), max_new_tokens,
                                           rl.overlong_buffer, rl.overlong_penalty)
    token_rewards = adv_lib.place_reward_on_last_token(rewards, mask)
    if not reuse:
      kl = kl_penalty(old_logp, ref_logp, mask, rl.kl_estimator, rl.kl_clamp or None)
      if rl.kl_in == "reward" and rl.kl_coef > 0:
        token_rewards = token_rewards - kl_coef * kl
    values = zeros if old_values is None else old_values
    advantages, returns = estimate_advantages(rl, group_size, token_rewards, mask, values,
                                              inputs)
    loss_mask = mask & ~rollout.truncated[:, None] if rl.mask_truncated else mask
    if rl.tis_cap > 0 and not reuse:
      is_weights = truncated_is_weights(old_logp, rollout.logprobs, mask, rl.tis_cap)
    else:
      is_weights = jnp.ones_like(zeros)
    batch = Batch(rollout.prompt_tokens, rollout.prompt_mask, rollout.completion_tokens, mask,
                  loss_mask, zeros if reuse else old_logp, ref_logp,
                  jnp.where(mask, advantages, 0.0), values, jnp.where(mask, returns, 0.0),
                  is_weights, jnp.where(mask, rollout.logprobs, 0.0))
    metrics = dict(shaped_reward_mean=jnp.mean(rewards),
                   advantage_abs_mean=masked_mean(jnp.abs(advantages), mask))
    if not reuse:  # otherwise the update reports these two
      metrics.update(rollout_kl=masked_mean(kl, mask), sampler_logprob_gap=masked_mean(
          jnp.abs(old_logp - rollout.logprobs), mask))
    if old_values is not None:
      metrics["value_mean"] = masked_mean(old_values, mask)
    return batch, metrics

  return prepare
