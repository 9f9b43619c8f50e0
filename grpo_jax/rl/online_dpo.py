"""Online DPO (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback"; TRL's
OnlineDPOTrainer): rl.objective = "online_dpo", one switch next to GRPO.

Each step samples G completions per prompt as GRPO does and scores them with the configured
rewards (rule, learned RM, remote or Python function). Per prompt, the best-scored completion is
the chosen one and the worst-scored the rejected one (the first of equals in row order); a
prompt whose completions all score the same makes no pair. On the pairs, the DPO loss against
the frozen reference:

    Δ_q  = [log π(y_c|x_q) - log π_ref(y_c|x_q)] - [log π(y_r|x_q) - log π_ref(y_r|x_q)]
    loss = (1 / P) Σ_{q with a pair} -log σ(β Δ_q)    (P: the prompts with a pair; 0 if none)

with log π(y|x) the sum of the completion's token log-probs. β is rl.kl_coef: DPO's β is the
weight of the KL regulariser to the reference, the quantity rl.kl_coef weighs in GRPO, and a
reference model exists exactly when it is > 0 (TRL's OnlineDPOConfig: beta 0.1). No separate
KL term is added (it is implicit in the DPO loss); the KL metric is still reported. TRL
samples two completions per prompt; with G > 2 the pair is the best and the worst of G.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl.aggregation import masked_sum
from grpo_jax.rl.kl import kl_penalty
from grpo_jax.rl.objective import check_objective_rules, register_objective


def best_and_worst(rewards: jax.Array, group_size: int):
  """(chosen rows, rejected rows, has_pair), each (Q,): per group of `group_size` consecutive
  rows the first row with the highest reward and the first with the lowest; has_pair is False
  where they are equal (ties are skipped)."""
  r = rewards.reshape(-1, group_size)
  base = jnp.arange(r.shape[0]) * group_size
  best, worst = jnp.argmax(r, axis=1), jnp.argmin(r, axis=1)
  return base + best, base + worst, jnp.max(r, axis=1) > jnp.min(r, axis=1)


def online_dpo_loss(logp, ref_logp, rewards, mask, group_size: int, beta: float):
  """The loss of the module docstring and its metrics (pairs: prompts with a pair;
  reward_margin: mean β Δ over them; pair_accuracy: share of them with Δ > 0). logp, ref_logp,
  mask (B, N); rewards (B,)."""
  sums = jnp.sum(jnp.where(mask, logp - ref_logp, 0.0), axis=1)  # log π/π_ref per completion
  chosen, rejected, has_pair = best_and_worst(rewards, group_size)
  delta = sums[chosen] - sums[rejected]
  pairs = jnp.sum(has_pair)
  def mean_over_pairs(x):
    return jnp.sum(jnp.where(has_pair, x, 0.0)) / jnp.maximum(pairs, 1)
  loss = mean_over_pairs(-jax.nn.log_sigmoid(beta * delta))
  return loss, dict(pairs=pairs.astype(jnp.float32),
                    reward_margin=mean_over_pairs(beta * delta),
                    pair_accuracy=mean_over_pairs((delta > 0).astype(jnp.float32)))


def _check(rl, group_size: int) -> None:
  rules = [
      (rl.kl_coef > 0, f"rl.kl_coef={rl.kl_coef} with rl.objective='online_dpo': it is DPO's beta "
       f"and gives the run its reference model; use a value > 0 (TRL: 0.1)."),
      (rl.kl_in == "loss" and not rl.adaptive_kl, f"rl.objective='online_dpo' takes rl.kl_coef as "
       f"a fixed beta; set rl.kl_in='loss' (not {rl.kl_in!r}) and rl.adaptive_kl=False."),
      (group_size >= 2, f"rollout.group_size={group_size} with rl.objective='online_dpo' makes no "
       f"pair; use group_size >= 2 (TRL samples 2)."),
      (rl.num_micro_batches == 1, f"rl.num_micro_batches={rl.num_micro_batches} with "
       f"rl.objective='online_dpo': the loss is a mean over the minibatch's pairs; use 1."),
  ]
  check_objective_rules(rl, "online_dpo", rules)


@register_objective("online_dpo", whole_groups=True)
def online_dpo_objective(rl, group_size: int):
  """rl.objective = "online_dpo" (module docstring). Needs each row's reward (`rewards`) and
  the reference's log-probs (`ref_logp`), and minibatches of whole groups. Metrics as the
  policy-gradient objective's (pg_loss is the DPO loss, clip_frac 0, kl to the reference as a
  metric) plus online_dpo_pairs, online_dpo_margin and online_dpo_pair_accuracy."""
  _check(rl, group_size)
  kl_estimator, kl_clamp, entropy_coef = rl.kl_estimator, rl.kl_clamp or None, rl.entropy_coef

  def objective(logp, old_logp, advantages, loss_mask, entropy, *, kl_coef, rewards=None,
                ref_logp=None, normalizer=None, **_):
    del advantages, normalizer
    if rewards is None or ref_logp is None:
      raise ValueError("rl.objective='online_dpo' needs each row's reward and the reference's "
                       "log-probs (rewards=..., ref_logp=...).")
    mask = loss_mask.astype(bool)
    loss, m = online_dpo_loss(logp, ref_logp, rewards, mask, group_size, kl_coef)
    tokens = jnp.sum(mask).astype(jnp.float32)
    if entropy_coef:
      loss = loss - entropy_coef * masked_sum(entropy, mask) / jnp.maximum(tokens, 1.0)
    kl = kl_penalty(logp, ref_logp, mask, kl_estimator, kl_clamp)
    ratio = jnp.exp(jnp.where(mask, logp - old_logp, 0.0))
    sums = dict(pg_loss=loss, kl=masked_sum(kl, mask), clip_frac=jnp.float32(0.0),
                entropy=masked_sum(entropy, mask), ratio=masked_sum(ratio, mask), tokens=tokens,
                online_dpo_pairs=m["pairs"], online_dpo_margin=m["reward_margin"],
                online_dpo_pair_accuracy=m["pair_accuracy"], loss=loss)
    return loss, sums

  return objective
