"""On-policy distillation (Agarwal et al. 2024, GKD; Thinking Machines' "On-Policy
Distillation", 2025): a frozen teacher scores the policy's own samples, token by token.

With a_t the sampled tokens of a completion, log pi(a_t) the sampling policy's log-probs (the
rollout's, at the sampling temperature) and log pi_T(a_t) the teacher's (temperature 1), the
per-token reverse KL estimate on the policy's own samples is

    KL_t = log pi(a_t) - log pi_T(a_t)          (E_{a ~ pi}[KL_t] = KL(pi || pi_T) at step t)

and rl.distill_coef = c puts it in the update in one of two places (rl.distill_in):

    "reward"  A_t <- A_t - c * KL_t              a per-token reward, no discounting (Tinker's
                                                 recipe: advantage = -reverse KL; the task's
                                                 advantages A_t still add to it)
    "loss"    loss_t <- loss_t + c * k(log pi_theta(a_t), log pi_T(a_t))
                                                 the rl.kl_estimator of KL(pi_theta || pi_T),
                                                 differentiated as the KL to the reference is

The teacher must share the policy's tokenizer (grpo_jax/rewards/sources.py checks it, one
sentence naming the mismatch) and is loaded, frozen and placed on the mesh like the reference.
"""

from __future__ import annotations

import jax.numpy as jnp

PLACEMENTS = ("reward", "loss")


def reverse_kl_per_token(sampler_logp, teacher_logp, mask):
  """KL_t = log pi(a_t) - log pi_T(a_t) on the completion tokens, 0 elsewhere. (B, N)."""
  return jnp.where(mask, sampler_logp - teacher_logp, 0.0)


def distilled_advantages(advantages, sampler_logp, teacher_logp, mask, coef: float):
  """A_t - c * KL_t on the completion tokens (rl.distill_in = "reward"). (B, N)."""
  return jnp.where(mask, advantages - coef * reverse_kl_per_token(sampler_logp, teacher_logp,
                                                                  mask), 0.0)
