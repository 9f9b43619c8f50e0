"""Per-token KL estimators between the policy and a reference (Schulman's k1/k2/k3)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def kl_k3(logprobs: jax.Array, ref_logprobs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Low-variance unbiased KL(pi || pi_ref) estimate per sampled token (DeepSeekMath eq. 4).

      k3 = exp(ref - logp) - (ref - logp) - 1  >= 0

  Inputs are log-probs of the same sampled tokens, any matching shape. Where `mask` is False
  the result is exactly 0 and no gradient flows (masked inputs are replaced before use).
  """
  if mask is not None:
    mask = mask.astype(bool)
    logprobs = jnp.where(mask, logprobs, 0.0)
    ref_logprobs = jnp.where(mask, ref_logprobs, 0.0)
  log_ratio = ref_logprobs - logprobs
  return jnp.exp(log_ratio) - log_ratio - 1.0
