"""Pairwise preference maths for reward-model training (Bradley-Terry, as InstructGPT, TRL's
RewardTrainer and OpenRLHF train outcome reward models)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def bradley_terry_loss(chosen_rewards, rejected_rewards, margin=0.0):
  """Mean negative log-likelihood that the chosen completion is preferred:

      L = mean_i  -log sigmoid(r_c,i - r_r,i - m_i)

  with an optional margin m (a scalar or one per pair; TRL's `margin` column). (B,) -> ()."""
  diff = (jnp.asarray(chosen_rewards, jnp.float32) - jnp.asarray(rejected_rewards, jnp.float32)
          - jnp.asarray(margin, jnp.float32))
  return -jnp.mean(jax.nn.log_sigmoid(diff))


def pair_accuracy(chosen_rewards, rejected_rewards):
  """The fraction of pairs the reward model orders right: mean_i [r_c,i > r_r,i] (a tie counts
  as wrong). (B,) -> ()."""
  return jnp.mean((jnp.asarray(chosen_rewards) > jnp.asarray(rejected_rewards)).astype(
      jnp.float32))
