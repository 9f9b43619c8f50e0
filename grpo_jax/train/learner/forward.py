"""One teacher-forced pass of the policy (and critic): log-probs, entropies and values of the
completion tokens. Shared by experience preparation and the update."""

from __future__ import annotations

import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.moe import load_balancing_loss, routes_differ
from grpo_jax.models.scoring import completion_scores
from grpo_jax.models.value_head import apply_value_head, separate_critic_values
from grpo_jax.models.vision.policy import vlm_prompt_inputs


def prompt_group(rl, group_size: int) -> int:
  """The run of consecutive rows that share a prompt in the forward passes: the update's group
  size with rl.shared_prompt_forward (each prompt run once, grpo_jax/models/scoring.py's
  shared_prompt_hidden), else 1 (every row runs its own prompt)."""
  return group_size if rl.shared_prompt_forward else 1


def routing_records(routing: dict, seqs, top_k: int) -> dict:
  """What a mixture's pass reports of its routing (moe.sown_routing) on a batch with the
  rollout's routing seqs.routes (B, P + N, L, k) or None:

    router_aux_loss   transformers' load-balancing loss over the real tokens (models/moe.py)
    mismatched, routed  (with seqs.routes) the number of (completion token, layer) pairs whose
                      recomputed top-k set differs from the rollout's, and of those pairs, over
                      the completion tokens the sampler ran (tokens 0 .. N - 2 that exist).
  """
  if not routing:
    return {}
  mask = jnp.concatenate([seqs.prompt_mask, seqs.completion_mask], axis=1).astype(bool)
  out = {"router_aux_loss": load_balancing_loss(routing["router_logits"], top_k,
                                                mask.reshape(-1))}
  if getattr(seqs, "routes", None) is not None:
    prompt_len, num_new = seqs.prompt_tokens.shape[1], seqs.completion_tokens.shape[1]
    ran = slice(prompt_len, prompt_len + num_new - 1)
    differ = routes_differ(routing["routes"][:, ran], seqs.routes[:, ran])  # (B, N - 1, L)
    real = seqs.completion_mask[:, :num_new - 1].astype(bool)[:, :, None]
    out["mismatched"] = jnp.sum(differ & real).astype(jnp.float32)
    out["routed"] = (jnp.sum(real) * differ.shape[-1]).astype(jnp.float32)
  return out


def policy_and_values(params, value_params, seqs, model_cfg: ModelConfig, value_head: str,
                      temperature: float, group: int = 1, token_capacity: int | None = None,
                      routing_replay: str = "off"):
  """seqs has prompt_tokens, prompt_mask, completion_tokens, completion_mask; group > 1: its
  rows come in runs of `group` with one prompt (see prompt_group); token_capacity: the
  completion tokens packed into that many slots (rl.pack_tokens, models/packing.py).
  routing_replay = "rollout" (a mixture of experts): the pass replays seqs.routes.

  Returns (logprobs, entropy, values, routing): the first three (B, N) and 0 where the
  completion is masked, values None without a critic; routing the pass's `routing_records`
  ({} for a dense model).
  """
  inputs = None
  if getattr(seqs, "images", None) is not None:  # a vision-language policy: its decoder reads
    # the prompts' embeddings (image features merged) at their mRoPE ids
    params, inputs = vlm_prompt_inputs(params, seqs.prompt_tokens,
                                       seqs.prompt_mask.astype(bool), seqs.images, model_cfg)
    model_cfg = model_cfg.text
  shared = value_head == "shared"
  moe = bool(model_cfg.num_experts)
  replay = moe and routing_replay == "rollout"
  out = completion_scores(params, model_cfg, seqs, temperature, return_hidden=shared,
                          prompt_group=group, token_capacity=token_capacity,
                          replay_routes=replay, record_routing=moe, inputs=inputs)
  logp, entropy, hidden = out[:3]
  routing = routing_records(out[3], seqs, model_cfg.experts_per_token) if moe else {}
  mask = seqs.completion_mask.astype(bool)
  values = None
  if shared:
    values = apply_value_head(value_params["head"], hidden)
  elif value_head == "separate":
    values = separate_critic_values(value_params, model_cfg, seqs.prompt_tokens,
                                    seqs.prompt_mask, seqs.completion_tokens, mask)
  zero = lambda x: None if x is None else jnp.where(mask, x, 0.0)  # noqa: E731
  return zero(logp), zero(entropy), zero(values), routing
