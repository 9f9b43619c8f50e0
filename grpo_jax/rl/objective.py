"""The RL objective as a pure function of arrays: no model, no params, no batch layout.

    per-token loss = pg_t * w_t * M_t  [+ beta * KL_t  if rl.kl_in == "loss", rl.kl_coef > 0]
                                       [- c_H * H_t    if rl.entropy_coef]
    loss           = agg(per-token loss)  [+ c_V * agg(value loss)   if values are given]

pg_t is the registered policy loss rl.loss (PPO-clip, asymmetric or dual clip, GSPO, ...:
grpo_jax/rl/losses.py) of log pi(a_t) against old log pi(a_t) and the advantage, w_t the
importance weight (rl.tis_cap > 0 or rl.is_correction: rl/corrections.py), M_t DeepSeek-V3.2's
off-policy sequence mask (when rl.opsm_delta > 0; rl/off_policy.py), KL_t the rl.kl_estimator of log pi against the
reference (rl/kl.py; times pi / pi_old with rl.unbiased_kl), H_t the entropy, and agg the
rl.loss_aggregation (rl/aggregation.py) over the loss mask with the given normaliser. The value loss is the clipped one of rl/losses.py
against the returns.

The update (grpo_jax/train/learner/update.py) is "forward, then this": it computes log-probs, entropy
and values with the model and calls the objective on them, so the objective is the exact loss
and gradient the update applies (tests/test_objective.py). Hyperparameters are bound when the
objective is built (`make_objective(rl)`, optax style); arrays come at the call. The shape is
verl's compute_policy_loss / TRL's _compute_loss: the arrays any framework has at that point,
so the loss can be compared with theirs without a model.

Arrays are (B, N) over completion tokens unless noted; `loss_mask` marks the tokens that carry
loss. Absent inputs are None: ref_logp None measures the KL metric against old_logp (no
reference model when rl.kl_coef == 0); values None has no value loss.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.errors import ConfigError
from grpo_jax.registry import Registry
from grpo_jax.rl.aggregation import aggregate, loss_normalizer, masked_sum
from grpo_jax.rl.kl import kl_penalty
from grpo_jax.rl.losses import POLICY_LOSSES, check_unread_settings, entropy_bonus, value_loss
from grpo_jax.rl.off_policy import importance_weighted_kl, off_policy_sequence_mask
from grpo_jax.rl import corrections  # noqa: F401  rl.is_correction and rl.loss "cispo"

# The objective's metric sums that are divided by the token count (`tokens`) once summed over
# micro-batches and minibatches; the others (pg_loss, value_loss, loss) are already normalised.
TOKEN_SUMS = ("kl", "clip_frac", "dual_clip_frac", "entropy", "ratio", "value_clip_frac",
              "opsm_masked_frac", "distill_kl")

Objective = Callable[..., tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class ObjectiveEntry:
  build: Callable  # build(rl, group_size, *, hyperparameters) -> Objective
  whole_groups: bool  # the update's minibatches must hold whole groups of group_size rows


# rl.objective: "policy_gradient" (below: the registered policy loss, KL, entropy and value
# terms, aggregated) or another registered objective (grpo_jax/rl/drpo.py).
OBJECTIVES = Registry("rl.objective")


def register_objective(name: str, *, whole_groups: bool = False, replace: bool = False):
  """Decorator: registers build(rl, group_size, *, hyperparameters) -> objective as rl.objective
  `name`; its keyword-only parameters are rl fields bound when it is built, and it raises
  ConfigError (one sentence) on settings it cannot serve."""

  def add(build):
    OBJECTIVES.register(name, ObjectiveEntry(build, whole_groups), replace=replace)
    return build
  return add


def check_objective_rules(rl, name: str, rules: list) -> None:
  """Raises ConfigError with the first broken rule's sentence: `rules` are (holds, sentence)
  pairs, and the rules every objective other than "policy_gradient" shares (no value loss, no
  truncated importance weights, none of DeepSeek-V3.2's switches; no reward shaping, as it
  reads the rewards as scored) are checked last."""
  rules = list(rules) + [(
      rl.value_head == "none" and not rl.tis_cap and not rl.opsm_delta and not rl.unbiased_kl
      and rl.get("is_correction", "none") == "none",
      f"rl.objective={name!r} has no value loss, importance weights or DeepSeek-V3.2 "
      f"switches; set rl.value_head='none', rl.tis_cap=0, rl.is_correction='none', "
      f"rl.opsm_delta=0, rl.unbiased_kl=False."), (
      not rl.overlong_buffer and not (rl.kl_in == "reward" and rl.kl_coef > 0),
      f"rl.objective={name!r} reads each completion's reward as scored, which the reward "
      f"shaping of rl.overlong_buffer={rl.overlong_buffer} and rl.kl_in={rl.kl_in!r} would not "
      f"reach; set rl.overlong_buffer=0 and rl.kl_in='loss'.")]
  for holds, sentence in rules:
    if not holds:
      raise ConfigError(sentence)


def gradient_needs_advantages(rl) -> bool:
  """True when, for these settings, rows whose advantages are all 0 have a zero gradient: the
  "policy_gradient" objective (every registered policy loss is a product with the advantage)
  without a KL term in the loss, an entropy bonus, a distillation loss term or a value loss.
  (The update leaves out such a micro-batch's backward pass; the model's own auxiliary loss,
  a MoE's router term, is the update's to check.)"""
  return (rl.objective == "policy_gradient" and not (rl.kl_in == "loss" and rl.kl_coef > 0)
          and not rl.entropy_coef and rl.value_head == "none"
          and not (rl.get("distill_coef", 0.0) > 0 and rl.get("distill_in") == "loss"))


def make_objective(rl, group_size: int = 1) -> Objective:
  """The registered objective rl.objective with its hyperparameters bound from rl, for rows
  that come in groups of `group_size` (consecutive rows, one prompt)."""
  entry = OBJECTIVES.get(rl.objective)
  return OBJECTIVES.bind(rl.objective, rl, entry.build)(rl, group_size)


@register_objective("policy_gradient")
def policy_gradient_objective(rl, group_size: int) -> Objective:
  """objective(logp, old_logp, advantages, loss_mask, entropy, *, kl_coef, ref_logp=None,
  is_weights=None, sampler_logp=None, values=None, old_values=None, returns=None,
  normalizer=None, rewards=None)
  -> (loss, sums) for the config's rl section (read here, once).

  logp: (B, N) log pi(a_t) of the policy being differentiated. old_logp: (B, N) the sampling
  policy's (or stop_gradient(logp) when they are equal). advantages: (B, N). loss_mask:
  (B, N) bool. entropy: (B, N) the policy's entropy per token (a metric; the bonus when
  rl.entropy_coef). kl_coef: the KL weight beta (a scalar array: the adaptive controller
  moves it). is_weights: (B, N) importance weights, required when rl.tis_cap > 0 or
  rl.is_correction != "none" (rl/corrections.py).
  sampler_logp: (B, N) the sampler's log-probs, required when rl.opsm_delta > 0.
  values / old_values / returns: (B, N) for a critic, else None. normalizer: the aggregation's
  denominator; None uses loss_normalizer(loss_mask) of these rows (pass the whole minibatch's
  when calling on one micro-batch of it, so that the micro-batches' losses add up to its).

  sums: pg_loss, kl, clip_frac, dual_clip_frac, entropy, ratio, tokens (+ value_loss,
  value_clip_frac with values; opsm_masked_frac, the masked tokens, with rl.opsm_delta),
  loss: per-token metrics summed over the loss mask (TOKEN_SUMS; divide by `tokens`) and the
  normalised losses, so that they add up over micro-batches.
  """
  mode, policy_loss = rl.loss_aggregation, POLICY_LOSSES.bind(rl.loss, rl)
  check_unread_settings(rl)
  # importance weights: rl.tis_cap's or rl.is_correction's (grpo_jax/rl/corrections.py)
  tis = rl.tis_cap > 0 or rl.get("is_correction", "none") != "none"
  kl_in_loss = rl.kl_in == "loss" and rl.kl_coef > 0
  kl_estimator, kl_clamp = rl.kl_estimator, rl.kl_clamp or None
  unbiased_kl, opsm_delta = rl.unbiased_kl, rl.opsm_delta
  entropy_coef, value_coef, value_clip = rl.entropy_coef, rl.value_coef, rl.value_clip_eps
  distill_coef = rl.get("distill_coef", 0.0)
  distill_in_loss = distill_coef > 0 and rl.get("distill_in") == "loss"
  del group_size  # rows are independent here

  def objective(logp, old_logp, advantages, loss_mask, entropy, *, kl_coef, ref_logp=None,
                is_weights=None, sampler_logp=None, values=None, old_values=None,
                returns=None, normalizer=None, rewards=None, teacher_logp=None):
    del rewards  # the advantages carry them
    mask = loss_mask.astype(bool)
    if normalizer is None:
      normalizer = loss_normalizer(mask, mode)
    ref_logp = old_logp if ref_logp is None else ref_logp
    pg, pm = policy_loss(logp, old_logp, advantages, mask)
    pm.setdefault("dual_clipped", jnp.zeros_like(mask))
    if tis:
      pg = pg * is_weights
    if opsm_delta:
      kept = off_policy_sequence_mask(logp, sampler_logp, advantages, mask, opsm_delta)
      pg = pg * kept
    kl = kl_penalty(logp, ref_logp, mask, kl_estimator, kl_clamp)
    if unbiased_kl:
      kl = importance_weighted_kl(kl, logp, old_logp, mask)
    per_token = pg
    if kl_in_loss:
      per_token = per_token + kl_coef * kl
    if entropy_coef:
      per_token = per_token + entropy_bonus(entropy, mask, entropy_coef)
    if distill_in_loss:  # on-policy distillation's loss term (grpo_jax/rl/distill.py)
      distill_kl = kl_penalty(logp, teacher_logp, mask, kl_estimator, kl_clamp)
      per_token = per_token + distill_coef * distill_kl
    loss = aggregate(per_token, mask, mode, normalizer)
    sums = dict(pg_loss=aggregate(pg, mask, mode, normalizer), kl=masked_sum(kl, mask),
                clip_frac=masked_sum(pm["clipped"], mask),
                dual_clip_frac=masked_sum(pm["dual_clipped"], mask),
                entropy=masked_sum(entropy, mask), ratio=masked_sum(pm["ratio"], mask),
                tokens=jnp.sum(mask).astype(jnp.float32))
    if opsm_delta:
      sums["opsm_masked_frac"] = masked_sum(1.0 - kept, mask)
    if distill_in_loss:
      sums["distill_kl"] = masked_sum(distill_kl, mask)
    if values is not None:
      vl, vm = value_loss(values, old_values, returns, mask, value_clip)
      v_agg = aggregate(vl, mask, mode, normalizer)
      loss = loss + value_coef * v_agg
      sums.update(value_loss=v_agg, value_clip_frac=masked_sum(vm["clipped"], mask))
    sums["loss"] = loss
    return loss, sums

  return objective
