"""Critics: a scalar value per completion position, from the policy's own backbone ("shared")
or from a separate decoder with its own params ("separate").

value_params is a plain pytree: {"head": {"kernel": (H, 1), "bias": (1,)}} for "shared", plus
"backbone" (decoder params) for "separate". V_t is read at the position whose logits predict
completion token t, i.e. the value of the state before token t.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.scoring import completion_logits

# The head's logical axes (grpo_jax/models/partitioning.py): the model dimension as the
# decoder's weights, the one output unsharded.
HEAD_AXES = {("head", "kernel"): ("embed", "value"), ("head", "bias"): ("value",)}


def init_value_params(kind: str, model_cfg: ModelConfig, policy_params, key):
  """A zero-initialised head; a separate critic's backbone starts as a copy of the policy
  (verl's and OpenRLHF's usual start, when no reward model is given)."""
  if kind == "none":
    return None
  head = {"kernel": jnp.zeros((model_cfg.hidden_size, 1), jnp.float32),
          "bias": jnp.zeros((1,), jnp.float32)}
  del key  # zero init needs none; kept in the signature for other initialisers
  if kind == "shared":
    return {"head": head}
  if kind == "separate":
    return {"head": head, "backbone": jax.tree.map(jnp.copy, policy_params)}
  raise ValueError(f"value head kind {kind!r} is unknown; valid: none, shared, separate.")


# ModelConfig fields that do not change a backbone's hidden states.
_NOT_MATHS = ("param_dtype", "compute_dtype", "remat", "logits_chunk", "attention_impl",
              "context_layout", "lora_scale", "tie_embeddings", "final_softcap",
              "max_position_embeddings")


def critic_from_reward_model(rm_params, rm_cfg: ModelConfig, model_cfg: ModelConfig):
  """A separate critic started from an outcome reward model (OpenRLHF's default): its backbone
  and its first score column as the value head (bias 0). The reward model must have the
  policy's architecture (the critic runs with the policy's ModelConfig): every field of the
  hidden states' maths equal (RoPE, norms, windows and soft-caps with the sizes; not the
  dtypes, memory and speed settings, nor what only the vocabulary projection reads)."""
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  fields = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in _NOT_MATHS]
  differ = [f"{f}={getattr(rm_cfg, f)} (policy {getattr(model_cfg, f)})" for f in fields
            if getattr(rm_cfg, f) != getattr(model_cfg, f)]
  if differ:
    raise ConfigError(f"rl.critic_init='reward_model' needs reward.models[0] of the policy's "
                      f"architecture, but it has {', '.join(differ)}; use such a reward model "
                      f"or rl.critic_init='policy'.")
  # copies: the state is donated to the RL step, the reward model's own arrays must survive it
  kernel = jnp.array(rm_params["score"]["kernel"][:, :1], jnp.float32, copy=True)
  return {"head": {"kernel": kernel, "bias": jnp.zeros((1,), jnp.float32)},
          "backbone": jax.tree.map(jnp.copy, rm_params["backbone"])}


def apply_value_head(head, hidden):
  """(B, N, H) hidden states -> (B, N) float32 values."""
  return (hidden.astype(jnp.float32) @ head["kernel"] + head["bias"])[..., 0]


def separate_critic_values(value_params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                           completion_tokens, completion_mask):
  """Values from the critic's own backbone."""
  hidden = completion_logits(value_params["backbone"], model_cfg, prompt_tokens, prompt_mask,
                            completion_tokens, completion_mask, project=False)
  return apply_value_head(value_params["head"], hidden)
