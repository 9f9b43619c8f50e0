"""The preference-optimisation step's pieces (grpo_jax/train/stages/preference.py runs the
stage): summed completion log-probs of the policy and the reference per pair (or labelled
completion), KTO's z0, the implicit-reward metrics, one guarded AdamW step of a grpo_jax/rl/dpo.py
loss, the reference's sums cached once over the training pairs, and the held-out pairs' metrics.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.data.supervised import LabelledBatch
from grpo_jax.models.lora import LoraParams
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rl.dpo import PREFERENCE_LOSSES, PairLogps, implicit_rewards, kto_reference_point
from grpo_jax.train.learner.state import guarded_update, policy_params, reference_params
from grpo_jax.train.stages.supervised import padded_batches


def pair_sums(params, model_cfg, prompt_tokens, prompt_mask, tokens, mask):
  """Summed log-probs of each row's completion tokens. (B,)"""
  logp, _ = completion_logprobs(params, model_cfg, prompt_tokens, prompt_mask, tokens, mask)
  return logp.sum(1)


def sequence_sums(params, model_cfg, b):
  """(chosen sums, rejected sums) of a PairBatch in one pass over its 2B rows; (sums,) of a
  LabelledBatch."""
  if isinstance(b, LabelledBatch):
    return (pair_sums(params, model_cfg, b.prompt_tokens, b.prompt_mask, b.tokens, b.mask),)
  twice = lambda x: jnp.concatenate([x, x])  # noqa: E731
  sums = pair_sums(params, model_cfg, twice(b.prompt_tokens), twice(b.prompt_mask),
                   jnp.concatenate([b.chosen_tokens, b.rejected_tokens]),
                   jnp.concatenate([b.chosen_mask, b.rejected_mask]))
  n = b.prompt_tokens.shape[0]
  return sums[:n], sums[n:]


def make_pair_logps(model_cfg, loss_name: str):
  """pair_logps(params, ref_params, batch, ref) -> PairLogps: the policy's sums, the
  reference's (`ref`, the cached pair, or computed from ref_params without gradient when ref is
  None; none for a reference-free loss) and KTO's z0 (prompt i with the chosen completion of
  row i - 1)."""
  entry = PREFERENCE_LOSSES.get(loss_name)
  reference_free = getattr(entry, "reference_free", False)
  needs_kl = getattr(entry, "needs_kl", False)

  def pair_logps(params, ref_params, b, ref=None):
    sums = sequence_sums(params, model_cfg, b)
    if not reference_free and ref is None:
      ref = jax.lax.stop_gradient(sequence_sums(ref_params, model_cfg, b))
    kl = None
    if needs_kl:  # prompt i with the completion of row i - 1
      tokens, mask = (b.tokens, b.mask) if isinstance(b, LabelledBatch) else (
          b.chosen_tokens, b.chosen_mask)
      shifted = (jnp.roll(tokens, 1, 0), jnp.roll(mask, 1, 0))
      kl = kto_reference_point(
          jax.lax.stop_gradient(pair_sums(params, model_cfg, b.prompt_tokens, b.prompt_mask,
                                          *shifted)),
          pair_sums(ref_params, model_cfg, b.prompt_tokens, b.prompt_mask, *shifted))
    if isinstance(b, LabelledBatch):
      return PairLogps(sums[0], None, b.mask.sum(1).astype(jnp.float32), None, ref[0], None,
                       kl, b.desirable)
    chosen, rejected = sums
    ref_chosen, ref_rejected = (None, None) if reference_free else ref
    return PairLogps(chosen, rejected, b.chosen_mask.sum(1).astype(jnp.float32),
                     b.rejected_mask.sum(1).astype(jnp.float32), ref_chosen, ref_rejected, kl)

  return pair_logps, reference_free


# Unpaired metrics that are means over one kind of completion: (its count, the means over it).
_MEANS_OF_KIND = (("desirable_count", ("rewards_chosen", "logps_chosen", "reward_margin")),
                  ("undesirable_count", ("rewards_rejected", "logps_rejected", "reward_margin")))


def reward_metrics(p: PairLogps, beta: float, reference_free: bool, prefix: str = "") -> dict:
  """Mean implicit rewards of the chosen and rejected completions, their margin, the share of
  pairs ordered right (a tie counts as wrong) and the mean summed log-probs.

  Unpaired (KTO's labelled completions): the `*_chosen` means are over the desirable
  completions, the `*_rejected` ones over the undesirable ones, label_accuracy over all, and
  the counts of each kind are metrics too (desirable_count, undesirable_count: TRL's
  KTOTrainer logs count/chosen and count/rejected). A batch may hold no completion of a kind:
  the means over it come out 0 here (jit keeps one set of keys), and `reported` leaves them out
  of the record, reward_margin with them. A mean over no completions has no value; a 0 would
  read as one, and a NaN would reach metrics.jsonl, which holds none. A key is absent for
  "none of that kind in this batch" as an evaluation metric is absent between evaluations."""
  chosen, rejected = implicit_rewards(p, beta, reference_free)
  if p.desirable is not None:  # unpaired: the labels split one set of completions
    d = p.desirable.astype(jnp.float32)
    mean = lambda x, w: jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)  # noqa: E731
    return {f"{prefix}rewards_chosen": mean(chosen, d),
            f"{prefix}rewards_rejected": mean(chosen, 1.0 - d),
            f"{prefix}reward_margin": mean(chosen, d) - mean(chosen, 1.0 - d),
            f"{prefix}label_accuracy": jnp.mean(((chosen > 0) == p.desirable).astype(jnp.float32)),
            f"{prefix}logps_chosen": mean(p.chosen, d),
            f"{prefix}logps_rejected": mean(p.chosen, 1.0 - d),
            f"{prefix}desirable_count": jnp.sum(d),
            f"{prefix}undesirable_count": jnp.sum(1.0 - d)}
  return {f"{prefix}rewards_chosen": jnp.mean(chosen),
          f"{prefix}rewards_rejected": jnp.mean(rejected),
          f"{prefix}reward_margin": jnp.mean(chosen - rejected),
          f"{prefix}pair_accuracy": jnp.mean((chosen > rejected).astype(jnp.float32)),
          f"{prefix}logps_chosen": jnp.mean(p.chosen),
          f"{prefix}logps_rejected": jnp.mean(p.rejected)}


def reported(metrics: dict, prefix: str = "") -> dict:
  """`metrics` (reward_metrics' and the step's) as the record's floats, without the means over a
  kind of labelled completion the batch holds none of (its `{prefix}*_count` is 0; see
  reward_metrics)."""
  record = {k: float(v) for k, v in metrics.items()}
  for count, means in _MEANS_OF_KIND:
    if record.get(prefix + count) == 0:
      for name in means:
        record.pop(prefix + name, None)
  return record


def make_dpo_step(model_cfg, optimizer, section):
  """step(state, batch, ref) -> (state, metrics): one AdamW step of section.loss (not applied
  when the loss or a gradient is not finite); ref: the batch's cached reference sums or None."""
  loss_fn = PREFERENCE_LOSSES.bind(section.loss, section)
  pair_logps, reference_free = make_pair_logps(model_cfg, section.loss)
  beta = float(section.beta)

  def step(state, b, ref):
    def objective(trainable):
      policy = (trainable if state.base_params is None else
                LoraParams(state.base_params, trainable))
      p = pair_logps(policy, reference_params(state), b, ref)
      return loss_fn(p), p

    (loss, p), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    state = guarded_update(state, grads, loss, optimizer)
    metrics = dict(loss=loss, **reward_metrics(p, beta, reference_free))
    if p.kl is not None:
      metrics["kl"] = p.kl
    return state, metrics

  return step


def cache_reference(model_cfg, ref_params, data, batch_size: int):
  """The reference's sums (sequence_sums) of every row of `data` (PairData, LabelledData), in
  row order."""
  run = jax.jit(functools.partial(sequence_sums, model_cfg=model_cfg))
  out = None
  for rows, padded in padded_batches(len(data), batch_size):
    sums = run(ref_params, b=data.batch(padded))
    out = out or tuple(np.zeros(len(data), np.float32) for _ in sums)
    for o, x in zip(out, sums):
      o[rows] = np.asarray(x)[:len(rows)]
  return out


def evaluate_pairs(pair_logps, reference_free, beta, state, data,
                   batch_size: int) -> dict:
  """The reward metrics (eval_ prefixed) over every held-out pair once (`reported`)."""
  parts = []
  for rows, padded in padded_batches(len(data), batch_size):
    p = pair_logps(policy_params(state), reference_params(state), data.batch(padded))
    parts.append(jax.tree.map(lambda x: np.asarray(x)[:len(rows)] if np.ndim(x) else x, p))
  joined = PairLogps(*[None if parts[0][i] is None or not np.ndim(parts[0][i])
                       else np.concatenate([q[i] for q in parts]) for i in range(len(parts[0]))])
  return reported(reward_metrics(joined, beta, reference_free, "eval_"), "eval_")
