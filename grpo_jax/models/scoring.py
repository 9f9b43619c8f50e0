"""Teacher-forced scoring: per-token log-probs and entropies of completions given prompts."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import Decoder, positions_from_mask


def completion_logits(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                      completion_tokens, completion_mask, return_hidden: bool = False):
  """Logits predicting each completion token, (B, N, V), from one no-cache forward pass.

  The sequence is [prompt (left-padded, P) | completion (N)]; the logits at position P-1+t
  predict completion token t. Only those N positions are projected onto the vocabulary.
  """
  prompt_len = prompt_tokens.shape[1]
  num_new = completion_tokens.shape[1]
  tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
  mask = jnp.concatenate([prompt_mask, completion_mask], axis=1).astype(bool)
  out = Decoder(model_cfg).apply({"params": params}, tokens, positions_from_mask(mask), mask,
                                 None, 0, return_hidden=return_hidden,
                                 logits_window=(prompt_len - 1, num_new))
  return (out[0], out[2]) if return_hidden else out[0]


def token_logprobs_and_entropy(logits, tokens, temperature: float = 1.0):
  """log pi(token) and H(pi) per position for pi = softmax(logits / temperature).

  logits (B, N, V), tokens (B, N) -> two (B, N) float32 arrays. The same arithmetic as
  jax.nn.log_softmax (shift by the stop-gradient max, subtract log-sum-exp), but the token is
  picked from the shifted logits rather than from the (B, N, V) log-softmax: XLA's backward
  pass of this form was over twice as fast on CPU at a 32k vocabulary (benchmarks/RESULTS.md).
  """
  if temperature not in (0.0, 1.0):
    logits = logits / temperature
  logits = logits.astype(jnp.float32)
  shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  log_z = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
  logp = jnp.take_along_axis(shifted, tokens[..., None], axis=-1)[..., 0] - log_z
  logp_all = shifted - log_z[..., None]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp, entropy


def completion_logprobs(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                        completion_tokens, completion_mask, temperature: float = 1.0):
  """(log-probs, entropies), each (B, N), zeroed where completion_mask is False."""
  logits = completion_logits(params, model_cfg, prompt_tokens, prompt_mask, completion_tokens,
                             completion_mask)
  logp, entropy = token_logprobs_and_entropy(logits, completion_tokens, temperature)
  mask = completion_mask.astype(bool)
  return jnp.where(mask, logp, 0.0), jnp.where(mask, entropy, 0.0)
