"""The policy (and critic) update, the second part of the RL step (grpo_jax/train/learner/step.py): a
pure `update(state, batch) -> (state, metrics)` (make_update; make_update_step jits it alone).

Each minibatch's loss is the model's forward (log-probs, entropy, values), then the objective
of grpo_jax/rl/objective.py on those arrays:

    per-token loss = pg_t * w_t  [+ beta * KL_t if KL is in the loss]  [- c_H * H_t]
    loss           = agg(per-token loss)  [+ c_V * agg(value loss)]

Each step makes mu = rl.num_iterations passes over the batch in
rl.num_minibatches shuffled minibatches, one optimizer step per minibatch; a minibatch may be
split into rl.num_micro_batches whose gradients are summed, exactly equal to the whole
minibatch's because each micro-batch is normalised by the minibatch's denominator.

When `reuses_current_logprobs(rl)` holds, the batch carries no old log-probs: the loss uses
stop_gradient(logp) (the same values, as its one gradient step runs at the sampling params) and
reports `rollout_kl` and `sampler_logprob_gap` that preparation then leaves out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.lora import LoraParams
from grpo_jax.rl.aggregation import loss_normalizer, masked_sum
from grpo_jax.rl.corrections import (CORRECTION_MAX, CORRECTION_MIN, correction_metrics,
                                     make_correction)
from grpo_jax.rl.kl import kl_penalty
from grpo_jax.rl.losses import truncated_is_weights
from grpo_jax.rl.objective import (OBJECTIVES, TOKEN_SUMS, gradient_needs_advantages,
                                   make_objective)
from grpo_jax.train.learner.experience import Batch, reuses_current_logprobs
from grpo_jax.train.learner.forward import policy_and_values, prompt_group
from grpo_jax.train.learner.state import TrainState, guarded_apply, step_key

# Metrics summed over micro-batches, then divided by the completion-token count
# (`completion_tokens`; see reuses_current_logprobs), as the objective's TOKEN_SUMS are by `tokens`.
_COMPLETION_SUMS = ("rollout_kl", "sampler_logprob_gap")
# The off-policy correction's sums (rl/corrections.py correction_sums), when the update computes
# its weights (reuses_current_logprobs): extrema reduced by max / min, the rest added up.
_CORRECTION_SUMS = ("is_ratio", "is_weight", "is_masked_frac", "behaviour_kl", "is_tokens")


def _combine(key: str):
  """How micro-batches' and minibatches' values of metric `key` combine."""
  return (jnp.maximum if key in CORRECTION_MAX else jnp.minimum if key in CORRECTION_MIN
          else jnp.add)


def _start(key: str) -> float:
  """The identity of _combine(key): the accumulator's start."""
  return -jnp.inf if key in CORRECTION_MAX else jnp.inf if key in CORRECTION_MIN else 0.0


def loss_and_sums(trainable, mb: Batch, normalizer, kl_coef, *, model_cfg: ModelConfig, rl,
                  temperature: float, base=None, group: int = 1, objective=None,
                  token_capacity: int | None = None):
  """The loss of (part of) a minibatch, normalised by `normalizer` (the whole minibatch's), and
  metric numerators, so that both add up exactly over micro-batches: the model's forward, then
  the objective of grpo_jax/rl/objective.py on its arrays. Under LoRA `base` is the frozen base
  (not differentiated) and trainable's policy part the adapters. group: see
  forward.prompt_group. objective: make_objective(rl), made here when not given.
  token_capacity: the completion tokens packed (forward.policy_and_values)."""
  params, value_params = trainable
  if base is not None:
    params = LoraParams(base, params)
  logp, entropy, values, routing = policy_and_values(params, value_params, mb, model_cfg,
                                                     rl.value_head, temperature, group,
                                                     token_capacity, rl.routing_replay)
  old_logp, is_weights = mb.old_logprobs, mb.is_weights
  reuse = reuses_current_logprobs(rl)
  if reuse:  # see reuses_current_logprobs: what preparation would have computed, exactly
    old_logp = jax.lax.stop_gradient(logp)
    # The policy's tokens: a multi-turn episode's environment tokens have no sampler log-prob.
    completion = (mb.completion_mask if mb.action_mask is None else mb.action_mask).astype(bool)
    if rl.tis_cap > 0:
      is_weights = truncated_is_weights(old_logp, mb.sampler_logprobs, completion, rl.tis_cap)
    correct = make_correction(rl)
    if correct is not None:  # rl.is_correction's, the sampler behaviour, the update proximal
      is_weights, correction = correct(mb.sampler_logprobs, old_logp, completion)
  objective = objective or make_objective(rl)
  loss, sums = objective(logp, old_logp, mb.advantages, mb.loss_mask, entropy, kl_coef=kl_coef,
                         ref_logp=mb.ref_logprobs, is_weights=is_weights,
                         sampler_logp=mb.sampler_logprobs, values=values,
                         old_values=mb.old_values, returns=mb.returns, normalizer=normalizer,
                         rewards=mb.outcome_rewards, teacher_logp=mb.teacher_logprobs)
  if routing:  # a mixture of experts: its load-balancing loss, a mean over micro-batches
    aux = routing["router_aux_loss"] / rl.num_micro_batches
    if rl.router_aux_coef:
      loss = loss + rl.router_aux_coef * aux
    sums["router_aux_loss"] = aux
    if reuse and "routed" in routing:  # at the sampling params: the rollout's mismatch
      sums.update(routing_mismatched=routing["mismatched"], routed=routing["routed"])
  if reuse:  # the rollout metrics preparation reports otherwise, over the completion tokens
    # Without a reference (rl.kl_coef == 0) the KL metric is measured against the old policy.
    ref_logp = old_logp if mb.ref_logprobs is None else mb.ref_logprobs
    rollout_kl = kl_penalty(old_logp, ref_logp, completion, rl.kl_estimator, rl.kl_clamp or None)
    sums.update(rollout_kl=masked_sum(rollout_kl, completion),
                sampler_logprob_gap=masked_sum(jnp.abs(old_logp - mb.sampler_logprobs),
                                               completion),
                completion_tokens=jnp.sum(completion).astype(jnp.float32))
    if correct is not None:
      sums.update(correction)
  return loss, sums


def minibatch_order(key, batch_size: int, passes: int, num_minibatches: int, group: int = 1):
  """The rows of each minibatch, (passes x num_minibatches, rows per minibatch) int32: every
  pass a fresh permutation (key folded with the pass) cut into equal minibatches; with
  group > 1 a permutation of whole groups of `group` consecutive rows, kept in their order.
  One pass in one minibatch keeps the batch's order."""
  if passes * num_minibatches == 1:
    return jnp.arange(batch_size)[None]

  def one_pass(e):
    k = jax.random.fold_in(key, e)
    if group == 1:
      return jax.random.permutation(k, batch_size)
    groups = jax.random.permutation(k, batch_size // group)
    return (group * groups[:, None] + jnp.arange(group)).reshape(-1)
  order = jnp.concatenate([one_pass(e) for e in range(passes)])
  return order.reshape(passes * num_minibatches, batch_size // num_minibatches)


def make_update(model_cfg: ModelConfig, rl, optimizer, temperature: float,
                group_size: int = 1, token_capacity: int | None = None):
  """update(state, batch) -> (state, metrics) for a config (the rl section is read at trace
  time): a pure function that the RL step (grpo_jax/train/learner/step.py) jits with the rest.
  group_size: the batch's completions per prompt (consecutive rows). With
  rl.shared_prompt_forward the minibatches are drawn as whole groups, so that each prompt's
  rows stay side by side and run their prompt once. token_capacity: each micro-batch's
  completion tokens packed into that many slots (rl.pack_tokens, models/packing.py)."""
  mu, num_mb, num_micro = rl.num_iterations, rl.num_minibatches, rl.num_micro_batches
  group = prompt_group(rl, group_size)
  skip_without_signal = rl.skip_without_signal
  # Known before the backward pass: a micro-batch whose advantages are all 0 has a zero
  # gradient when nothing else in the loss carries one (rl/objective.py
  # gradient_needs_advantages; a MoE's load-balancing term does). Its backward is then left
  # out (the forward still runs, for the metrics; under a vmap over seeds the cond becomes a
  # select and both branches run).
  backward_needs_advantages = (skip_without_signal and gradient_needs_advantages(rl) and
                               not (getattr(model_cfg, "num_experts", 0) and rl.router_aux_coef))
  objective = make_objective(rl, group_size)
  # Minibatches of whole groups for the shared prompt forward or a group-wise objective.
  order_group = group_size if OBJECTIVES.get(rl.objective).whole_groups else group

  def minibatch_grads(trainable, mb: Batch, kl_coef, base):
    """Summed gradients of the minibatch's micro-batches (== the minibatch's gradient)."""
    normalizer = loss_normalizer(mb.loss_mask, rl.loss_aggregation)
    micro = jax.tree.map(lambda x: x.reshape(num_micro, -1, *x.shape[1:]), mb)

    def grad_of(part):
      def loss_of(t):
        return loss_and_sums(t, part, normalizer, kl_coef, model_cfg=model_cfg, rl=rl,
                             temperature=temperature, base=base, group=group,
                             objective=objective, token_capacity=token_capacity)
      if not backward_needs_advantages:
        return jax.value_and_grad(loss_of, has_aux=True)(trainable)
      # The forward once; its backward only where some advantage is not 0.
      loss, backward, sums = jax.vjp(loss_of, trainable, has_aux=True)
      grads = jax.lax.cond(jnp.any(part.advantages != 0),
                           lambda: backward(jnp.ones_like(loss))[0],
                           lambda: jax.tree.map(jnp.zeros_like, trainable))
      return (loss, sums), grads

    def one(acc, part):
      (_, sums), grads = grad_of(part)
      acc_grads, acc_sums = acc
      return (jax.tree.map(jnp.add, acc_grads, grads),
              {k: _combine(k)(acc_sums[k], v) for k, v in sums.items()}), None

    zero_sums = jax.eval_shape(lambda: grad_of(jax.tree.map(lambda x: x[0], micro))[0][1])
    init = (jax.tree.map(jnp.zeros_like, trainable),
            {k: jnp.full(s.shape, _start(k), s.dtype) for k, s in zero_sums.items()})
    (grads, sums), _ = jax.lax.scan(one, init, micro)
    return grads, sums

  def update_step(state: TrainState, batch: Batch):
    batch_size = batch.completion_tokens.shape[0]
    key = step_key(state, 1)
    minibatch_rows = minibatch_order(key, batch_size, mu, num_mb, order_group)

    def one_minibatch(carry, rows):
      trainable, opt_state, in_a_row = carry
      mb = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), batch)
      grads, sums = minibatch_grads(trainable, mb, state.kl_coef, state.base_params)
      trainable, opt_state, finite, signal = guarded_apply(
          trainable, opt_state, grads, sums["loss"], optimizer,
          skip_without_signal=skip_without_signal)
      sums["grad_norm"] = optax.tree.norm(grads)
      sums["skipped"] = 1 - finite.astype(jnp.int32)
      sums["no_signal"] = (finite & ~signal).astype(jnp.int32)
      in_a_row = jnp.where(finite, 0, in_a_row + 1)
      return (trainable, opt_state, in_a_row), sums

    (trainable, opt_state, in_a_row), per_mb = jax.lax.scan(
        one_minibatch, ((state.params, state.value_params), state.opt_state,
                        state.consecutive_skips), minibatch_rows)
    tokens = jnp.maximum(jnp.sum(per_mb["tokens"]), 1.0)
    correction = _CORRECTION_SUMS + CORRECTION_MAX + CORRECTION_MIN
    metrics = {k: (jnp.sum(v) / tokens if k in TOKEN_SUMS else jnp.mean(v))
               for k, v in per_mb.items()
               if k not in ("tokens", "skipped", "no_signal", "completion_tokens",
                            "routing_mismatched", "routed") + _COMPLETION_SUMS + correction}
    if "is_tokens" in per_mb:  # the correction's metrics over all minibatches
      metrics.update(correction_metrics(
          {k: _combine(k).reduce(v) for k, v in per_mb.items() if k in correction}))
    if "routed" in per_mb:
      metrics["routing_mismatch"] = (jnp.sum(per_mb["routing_mismatched"]) /
                                     jnp.maximum(jnp.sum(per_mb["routed"]), 1.0))
    if "completion_tokens" in per_mb:
      completion_tokens = jnp.maximum(jnp.sum(per_mb["completion_tokens"]), 1.0)
      metrics.update({k: jnp.sum(per_mb[k]) / completion_tokens for k in _COMPLETION_SUMS})
    skipped = state.skipped_updates + jnp.sum(per_mb["skipped"])
    metrics["skipped_updates"] = skipped
    no_signal = state.no_signal_updates + jnp.sum(per_mb["no_signal"])
    metrics["no_signal_updates"] = no_signal
    # The update's result too (a read of the new params and moments, no copy): the loop stops
    # before saving a state that is not finite although its loss and gradients were.
    metrics["state_finite"] = jnp.all(jnp.array(
        [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves((trainable, opt_state))
         if jnp.issubdtype(x.dtype, jnp.inexact)])).astype(jnp.float32)
    new_state = state.replace(step=state.step + 1, params=trainable[0],
                              value_params=trainable[1], opt_state=opt_state,
                              skipped_updates=skipped, consecutive_skips=in_a_row,
                              no_signal_updates=no_signal)
    return new_state, metrics

  return update_step


def make_update_step(model_cfg: ModelConfig, rl, optimizer, temperature: float,
                     group_size: int = 1):
  """The update alone, jitted: for tests of its parts (a run jits the whole RL step)."""
  return jax.jit(make_update(model_cfg, rl, optimizer, temperature, group_size))

