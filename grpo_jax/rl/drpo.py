"""DRPO, Decoupled Reward Policy Optimization (Li, Chen, Lin, Yang; arXiv 2510.04474, ICLR 2026;
the authors' code: github.com/Optimization-AI/DRPO, verl/verl/trainer/ppo/core_algos.py
`compute_policy_loss_drpo`). Selected with rl.objective = "drpo".

DRPO builds on DisCO's discriminative objective: it raises the score of each prompt's correct
completions and lowers a soft maximum of its wrong ones', with no group-relative advantage, so a
correct completion is never pushed down. Its length signal lives on the positive side only:
correct completions are weighted by the closed-form optimum of "length reward under a KL
regulariser to the sampling policy", P*(o) proportional to pi_old(o) exp(r(o) / lambda), which on
on-policy samples is an importance weight normalised over the prompt's correct completions.

For each prompt q with G completions o_i, correctness c_i (reward 1 correct, 0 wrong; other
values and empty completions take no part), |o_i| tokens and N the completion length limit:

    s_i     = (1 / |o_i|) sum_t log pi_theta(o_i,t)                 (DisCO's log-likelihood score)
    r_i     = 1 - |o_i| / N                                          (length reward of a correct o_i)
    w_i     = exp(r_i / lambda) / sum_{k correct} exp(r_k / lambda)  (P* / pi_old, self-normalised)
    J_q     = sum_{i correct} w_i s_i - tau log( (1 / n_-) sum_{j wrong} exp(s_j / tau) )
    J       = (1 / Q) sum_{q with both correct and wrong completions} J_q   (Q: every prompt)

and the trust region KL(pi_old || pi_theta) <= delta is held by a penalty whose weight is not
differentiated (the authors' code):

    KL      = token mean of  log pi_old - log pi_theta                     (drpo_kl = "k1")
           or token mean of  (log pi_old - log pi_theta) + pi_theta / pi_old - 1   ("k3")
    loss    = -J + stop_gradient(beta * max(KL - delta, 0)) * KL

The authors' code returns tau * S / stop_gradient(S) (S the negatives' sum of exponentials) in
place of the log-mean-exp: the same gradient, another value. Here the loss value is the paper's
(`drpo_loss`), and tests/test_drpo.py checks its gradient against the authors' function and
both against a NumPy transcription of the formulas above.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl._checks import as_token_mask, require_shape
from grpo_jax.rl.aggregation import masked_sum
from grpo_jax.rl.kl import kl_penalty
from grpo_jax.rl.objective import check_objective_rules, register_objective


def drpo_weights(correct: jax.Array, valid: jax.Array, lengths: jax.Array, max_length: int,
                 group_size: int, drpo_lambda: float) -> jax.Array:
  """(B,) w_i = exp(r_i / lambda) / sum_{k correct in i's group} exp(r_k / lambda) on the
  correct rows of valid groups, 0 elsewhere; r_i = 1 - |o_i| / N. correct (B,) bool; valid
  (Q,) bool, the groups that hold a correct and a wrong row; lengths (B,) token counts; groups
  are consecutive rows."""
  correct = correct.reshape(-1, group_size)
  logit = (1.0 - lengths.reshape(-1, group_size) / max_length) / drpo_lambda
  # a group without a correct row has no weights: its softmax runs over zeros, then is dropped
  logit = jnp.where(correct, logit, jnp.where(valid[:, None], -jnp.inf, 0.0))
  weights = jax.nn.softmax(logit, axis=1)
  return jnp.where(valid[:, None] & correct, weights, 0.0).reshape(-1)


def drpo_loss(logprobs: jax.Array, old_logprobs: jax.Array, rewards: jax.Array,
              mask: jax.Array, group_size: int, *, drpo_lambda: float, drpo_tau: float,
              drpo_delta: float, drpo_beta: float, drpo_kl: str = "k1"):
  """DRPO's loss (module docstring) of B = prompts x group_size rows (groups consecutive).

  logprobs, old_logprobs (B, N): log pi_theta and log pi_old of the completion tokens; rewards
  (B,): 1 correct, 0 wrong (other values take no part); mask (B, N) the tokens that carry loss.
  Returns (loss, metrics): pg_loss = -J, kl (the trust region's KL), penalty_active (KL >
  delta, 0/1), and groups (the prompts with a correct and a wrong completion)."""
  mask = as_token_mask(mask, logprobs)
  require_shape("old_logprobs", old_logprobs, mask.shape)
  require_shape("rewards", rewards, mask.shape[:1])
  groups = lambda x: x.reshape(-1, group_size)  # noqa: E731  (Q, G)
  lengths = jnp.sum(mask, axis=1).astype(jnp.float32)
  scores = jnp.sum(jnp.where(mask, logprobs, 0.0), axis=1) / jnp.maximum(lengths, 1.0)
  correct, wrong = (lengths > 0) & (rewards == 1), (lengths > 0) & (rewards == 0)
  wrong_g, n_wrong = groups(wrong), jnp.sum(groups(wrong), axis=1)
  valid = jnp.any(groups(correct), axis=1) & (n_wrong > 0)
  weights = drpo_weights(correct, valid, lengths, mask.shape[1], group_size, drpo_lambda)
  positive = jnp.sum(groups(weights * scores), axis=1)
  # tau log mean_{j wrong} exp(s_j / tau), shifted by the (constant) largest wrong score
  scaled = groups(scores) / drpo_tau
  top = jax.lax.stop_gradient(jnp.max(jnp.where(wrong_g, scaled, -1e30), axis=1))
  sum_exp = jnp.sum(jnp.exp(jnp.where(wrong_g, scaled - top[:, None], -jnp.inf)), axis=1)
  negative = drpo_tau * (top + jnp.log(sum_exp + (n_wrong == 0)) - jnp.log(
      jnp.maximum(n_wrong, 1)))
  objective = jnp.sum(jnp.where(valid, positive - negative, 0.0)) / valid.shape[0]
  log_ratio = jnp.where(mask, logprobs - old_logprobs, 0.0)
  per_token = -log_ratio if drpo_kl == "k1" else jnp.exp(log_ratio) - log_ratio - 1.0
  kl = masked_sum(per_token, mask) / jnp.maximum(jnp.sum(mask), 1)
  active = kl > drpo_delta
  penalty = jax.lax.stop_gradient(drpo_beta * jnp.maximum(kl - drpo_delta, 0.0)) * kl
  metrics = dict(pg_loss=-objective, kl=kl, penalty_active=active.astype(jnp.float32),
                 groups=jnp.sum(valid).astype(jnp.float32))
  return -objective + penalty, metrics


def _check(rl, group_size: int, drpo_lambda, drpo_tau, drpo_delta, drpo_beta, drpo_kl) -> None:
  """The settings DRPO's objective does not combine with, each one sentence."""
  rules = [
      (drpo_kl in ("k1", "k3"), f"rl.drpo_kl={drpo_kl!r}; use 'k1' (the authors' recipe, "
       f"ppo_kl_type=kl) or 'k3' (their low_var_kl)."),
      (group_size >= 2, f"rollout.group_size={group_size} with rl.objective='drpo' leaves no "
       f"wrong completion to contrast a correct one with; use group_size >= 2 (8 in the paper)."),
      (drpo_lambda > 0 and drpo_tau > 0, f"rl.drpo_lambda={drpo_lambda}, rl.drpo_tau={drpo_tau}; "
       f"both must be > 0 (the paper: lambda 0.1 to 1, tau 10)."),
      (drpo_delta >= 0 and drpo_beta >= 0, f"rl.drpo_delta={drpo_delta}, rl.drpo_beta="
       f"{drpo_beta}; both must be >= 0 (the authors: 1e-4 and 1e3)."),
      (rl.num_micro_batches == 1, f"rl.num_micro_batches={rl.num_micro_batches} with "
       f"rl.objective='drpo': its trust-region weight depends on the whole minibatch's KL, so "
       f"micro-batches would not add up; use 1 (smaller minibatches instead)."),
  ]
  check_objective_rules(rl, "drpo", rules)


@register_objective("drpo", whole_groups=True)
def drpo_objective(rl, group_size: int, *, drpo_lambda=0.1, drpo_tau=10.0, drpo_delta=1e-4,
                   drpo_beta=1e3, drpo_kl="k1"):
  """rl.objective = "drpo": `drpo_loss` with the hyperparameters bound (the authors' 1.5B
  recipe: lambda 0.1, tau 10, delta 1e-4, beta 1e3, the k1 trust-region KL), plus the reference KL (rl.kl_coef with
  rl.kl_in = "loss") and the entropy bonus as token means, as the authors' actor adds them.
  Needs each row's outcome reward (`rewards`, 1 correct / 0 wrong) and minibatches of whole
  groups. Metrics as the policy-gradient objective's: pg_loss, kl (to the reference), entropy,
  ratio, tokens, loss; clip_frac is the share of tokens whose minibatch had the trust-region
  penalty on (KL > delta), drpo_kl that KL and drpo_groups the prompts that took part."""
  _check(rl, group_size, drpo_lambda, drpo_tau, drpo_delta, drpo_beta, drpo_kl)
  kl_in_loss = rl.kl_in == "loss" and rl.kl_coef > 0
  kl_estimator, kl_clamp, entropy_coef = rl.kl_estimator, rl.kl_clamp or None, rl.entropy_coef
  hyper = dict(drpo_lambda=drpo_lambda, drpo_tau=drpo_tau, drpo_delta=drpo_delta,
               drpo_beta=drpo_beta, drpo_kl=drpo_kl)

  def objective(logp, old_logp, advantages, loss_mask, entropy, *, kl_coef, rewards=None,
                ref_logp=None, normalizer=None, **_):
    del advantages, normalizer  # DRPO's signal is the rewards and the scores themselves
    if rewards is None:
      raise ValueError("rl.objective='drpo' needs each row's outcome reward (rewards=...).")
    mask = loss_mask.astype(bool)
    loss, m = drpo_loss(logp, old_logp, rewards, mask, group_size, **hyper)
    tokens = jnp.sum(mask).astype(jnp.float32)
    ref_logp = old_logp if ref_logp is None else ref_logp
    kl = kl_penalty(logp, ref_logp, mask, kl_estimator, kl_clamp)
    if kl_in_loss:
      loss = loss + kl_coef * masked_sum(kl, mask) / jnp.maximum(tokens, 1.0)
    if entropy_coef:
      loss = loss - entropy_coef * masked_sum(entropy, mask) / jnp.maximum(tokens, 1.0)
    ratio = jnp.exp(jnp.where(mask, logp - old_logp, 0.0))
    sums = dict(pg_loss=m["pg_loss"], kl=masked_sum(kl, mask),
                clip_frac=m["penalty_active"] * tokens, entropy=masked_sum(entropy, mask),
                ratio=masked_sum(ratio, mask), tokens=tokens, drpo_kl=m["kl"],
                drpo_groups=m["groups"], loss=loss)
    return loss, sums

  return objective
