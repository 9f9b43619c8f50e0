"""DeepSeek-V3.2's corrections for off-policy samples (arXiv 2512.02556, section 3.1 "Scaling
GRPO"), each a switch of the objective (grpo_jax/rl/objective.py):

* rl.unbiased_kl, eq. (7): the k3 KL term weighted by the importance ratio of the current
  policy to the one that sampled the tokens, so that its gradient is unbiased for samples of
  pi_old (`importance_weighted_kl`);
* rl.opsm_delta, eqs. (8)-(9), off-policy sequence masking: a completion with a negative
  advantage whose sampler-to-policy KL exceeds delta carries no policy-gradient loss
  (`off_policy_sequence_mask`; the KL term is not masked).

Peers with the same switches (read to fix the conventions): TRL's GRPOTrainer
(use_bias_correction_kl, off_policy_mask_threshold), slime (--use-unbiased-kl, --use-opsm,
--opsm-delta), cosmos-rl (unbiased_kl_estimate, off_policy_masking_delta).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl._checks import require_shape


def importance_weighted_kl(kl: jax.Array, logprobs: jax.Array, old_logprobs: jax.Array,
                           mask: jax.Array, log_ratio_clamp: float = 20.0) -> jax.Array:
  """DeepSeek-V3.2 eq. (7): a per-token KL estimate of tokens sampled from pi_old, weighted by
  the importance ratio (gradient kept: that is what makes it unbiased for pi_theta):

      KL'_t = pi_theta(o_t) / pi_old(o_t) * KL_t = exp(clip(logp_t - old_t, -c, c)) * KL_t

  with KL_t the k3 estimate (rl/kl.py) in the paper; 0 where ~mask. c (default 20) keeps the
  ratio finite.
  """
  require_shape("old_logprobs", old_logprobs, jnp.shape(logprobs))
  mask = jnp.asarray(mask).astype(bool)
  log_ratio = jnp.where(mask, logprobs - old_logprobs, 0.0)
  ratio = jnp.exp(jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp))
  return jnp.where(mask, ratio * kl, 0.0)


def off_policy_sequence_mask(logprobs: jax.Array, sampler_logprobs: jax.Array,
                             advantages: jax.Array, mask: jax.Array, delta: float) -> jax.Array:
  """DeepSeek-V3.2 eq. (9), off-policy sequence masking (OPSM), per token:

      M_{i,t} = 0  if A_{i,t} < 0 and
                     (1/|o_i|) sum_t log(pi_old(o_{i,t}) / pi_theta(o_{i,t})) > delta
                1  otherwise

  pi_old the sampler's probabilities (what the inference engine returned: the term sees both
  minibatch staleness and sampler/trainer mismatch), pi_theta the current policy, |o_i| the
  row's tokens in `mask`. Multiply the policy-gradient loss by M (eq. (8)). No gradient flows
  through M; a row without tokens is kept. (B, N) float32, 0 where ~mask.
  """
  require_shape("sampler_logprobs", sampler_logprobs, jnp.shape(logprobs))
  require_shape("advantages", advantages, jnp.shape(logprobs))
  mask = jnp.asarray(mask).astype(bool)
  gap = jnp.where(mask, sampler_logprobs - jax.lax.stop_gradient(logprobs), 0.0)
  tokens = jnp.sum(mask, axis=-1, keepdims=True)
  seq_kl = jnp.sum(gap, axis=-1, keepdims=True) / jnp.maximum(tokens, 1)
  drop = (advantages < 0) & (seq_kl > delta)
  return jnp.where(mask & ~drop, 1.0, 0.0).astype(jnp.float32)
