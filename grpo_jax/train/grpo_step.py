"""The GRPO update: a pure `update_step(state, batch) -> (state, metrics)`.

    loss = agg_t[ -min(rho_t A_t, clip(rho_t, 1-eps, 1+eps) A_t) + beta * k3_t ]

over mu passes (rl.num_iterations) of rl.num_minibatches shuffled minibatches each, one
optimizer step per minibatch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rl.kl import kl_k3
from grpo_jax.rl.losses import aggregate, clipped_surrogate, masked_mean
from grpo_jax.train.state import TrainState, apply_if_finite, step_key


class Batch(NamedTuple):
  """What the update consumes; every array has the batch dimension B first."""
  prompt_tokens: jax.Array  # (B, P)
  prompt_mask: jax.Array  # (B, P)
  completion_tokens: jax.Array  # (B, N)
  completion_mask: jax.Array  # (B, N)
  old_logprobs: jax.Array  # (B, N) under the policy that sampled (recomputed by the trainer)
  ref_logprobs: jax.Array  # (B, N) under the frozen reference
  advantages: jax.Array  # (B, N), 0 on masked tokens


def grpo_loss(params, batch: Batch, model_cfg: ModelConfig, rl_cfg, temperature: float):
  """Scalar loss and its diagnostics for one minibatch."""
  mask = batch.completion_mask
  logp, entropy = completion_logprobs(params, model_cfg, batch.prompt_tokens,
                                      batch.prompt_mask, batch.completion_tokens, mask,
                                      temperature)
  pg_loss, clipped = clipped_surrogate(logp, batch.old_logprobs, batch.advantages, mask,
                                       rl_cfg.clip_eps, rl_cfg.clip_eps)
  kl = kl_k3(logp, batch.ref_logprobs, mask)
  per_token = pg_loss + rl_cfg.kl_coef * kl
  loss = aggregate(per_token, mask, rl_cfg.loss_aggregation)
  metrics = dict(pg_loss=aggregate(pg_loss, mask, rl_cfg.loss_aggregation),
                 kl=masked_mean(kl, mask), clip_frac=masked_mean(clipped, mask),
                 entropy=masked_mean(entropy, mask))
  return loss, metrics


def make_update_step(model_cfg: ModelConfig, rl_cfg, optimizer, temperature: float):
  """Builds the jitted update. Minibatches are static slices of a per-step permutation."""
  mu, num_mb = rl_cfg.num_iterations, rl_cfg.num_minibatches
  grad_fn = jax.value_and_grad(grpo_loss, has_aux=True)

  @jax.jit
  def update_step(state: TrainState, batch: Batch):
    batch_size = batch.completion_tokens.shape[0]
    mb_size = batch_size // num_mb
    key = step_key(state, 1)
    order = jnp.concatenate([jax.random.permutation(jax.random.fold_in(key, e), batch_size)
                             for e in range(mu)]) if (mu * num_mb > 1) else jnp.arange(batch_size)
    minibatch_rows = order.reshape(mu * num_mb, mb_size)

    def one_minibatch(carry, rows):
      params, opt_state = carry
      mb = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), batch)
      (loss, metrics), grads = grad_fn(params, mb, model_cfg, rl_cfg, temperature)
      params, opt_state, applied = apply_if_finite(params, opt_state, grads, loss, optimizer)
      metrics = dict(metrics, loss=loss, grad_norm=_global_norm(grads),
                     skipped=1 - applied.astype(jnp.int32))
      return (params, opt_state), metrics

    (params, opt_state), per_mb = jax.lax.scan(one_minibatch, (state.params, state.opt_state),
                                               minibatch_rows)
    skipped = jnp.sum(per_mb.pop("skipped"))
    metrics = jax.tree.map(jnp.mean, per_mb)
    metrics["skipped_updates"] = state.skipped_updates + skipped
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              skipped_updates=state.skipped_updates + skipped)
    return new_state, metrics

  return update_step


def _global_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))
