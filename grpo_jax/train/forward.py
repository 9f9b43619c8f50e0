"""One teacher-forced pass of the policy (and critic): log-probs, entropies and values of the
completion tokens. Shared by experience preparation and the update."""

from __future__ import annotations

import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.scoring import completion_scores
from grpo_jax.models.value_head import apply_value_head, separate_critic_values


def prompt_group(rl, group_size: int) -> int:
  """The run of consecutive rows that share a prompt in the forward passes: the update's group
  size with rl.shared_prompt_forward (each prompt run once, grpo_jax/models/scoring.py's
  shared_prompt_hidden), else 1 (every row runs its own prompt)."""
  return group_size if rl.shared_prompt_forward else 1


def policy_and_values(params, value_params, seqs, model_cfg: ModelConfig, value_head: str,
                      temperature: float, group: int = 1, token_capacity: int | None = None):
  """seqs has prompt_tokens, prompt_mask, completion_tokens, completion_mask; group > 1: its
  rows come in runs of `group` with one prompt (see prompt_group); token_capacity: the
  completion tokens packed into that many slots (rl.pack_tokens, models/packing.py).

  Returns (logprobs, entropy, values), each (B, N) and 0 where the completion is masked;
  values is None without a critic.
  """
  shared = value_head == "shared"
  logp, entropy, hidden = completion_scores(params, model_cfg, seqs, temperature,
                                            return_hidden=shared, prompt_group=group,
                                            token_capacity=token_capacity)
  mask = seqs.completion_mask.astype(bool)
  values = None
  if shared:
    values = apply_value_head(value_params["head"], hidden)
  elif value_head == "separate":
    values = separate_critic_values(value_params, model_cfg, seqs.prompt_tokens,
                                    seqs.prompt_mask, seqs.completion_tokens, mask)
  zero = lambda x: None if x is None else jnp.where(mask, x, 0.0)  # noqa: E731
  return zero(logp), zero(entropy), zero(values)
