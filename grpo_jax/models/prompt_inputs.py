"""What a forward pass reads of a prompt besides its token ids, for a policy whose prompts are
not text alone (a vision-language policy: image features at the placeholder tokens, 3-D
rotary ids). Text prompts need none of it: their embeddings are looked up from the tokens and
their positions count the real tokens (decoder.positions_from_mask).

The engines (rollout/) prefill with it and place each decode step at next_position + step;
the teacher-forced passes (models/scoring.py) run the prompt with it and the completion after
it, so a sampled row is scored at the positions it was drawn at."""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.lora import base_params


def embed_tokens(cfg: ModelConfig, params, tokens) -> jax.Array:
  """(B, T, E) input embeddings of token ids as the Decoder looks them up: the table's rows in
  the compute dtype, times the family's scale (params: plain or LoraParams). A prompt's
  PromptInputs.embeddings start from these."""
  table = base_params(params)["embed_tokens"]["embedding"]
  x = jnp.take(jnp.asarray(table, cfg.dtype), tokens, axis=0)
  scale = cfg.blocks.embed_scale(cfg)
  return x if scale is None else x * jnp.asarray(scale, cfg.dtype)


class PromptInputs(NamedTuple):
  """A batch of left-padded prompts (B, P) as the decoder reads them."""
  embeddings: Optional[jax.Array]  # (B, P, E) input embeddings; None: looked up from the ids
  positions: jax.Array  # (B, P) or (3, B, P) int32 rotary ids (the family's rotary reads them)
  next_position: jax.Array  # (B,) int32: the rotary id of completion token 0 (on every axis)

  def with_completion(self, num_new: int) -> jax.Array:
    """The rotary ids of the prompt followed by N = num_new completion tokens, token k at
    next_position + k: (B, P + N), or (3, B, P + N) when the prompt's are 3-D."""
    new = (self.next_position[:, None] + jnp.arange(num_new, dtype=jnp.int32)).astype(
        self.positions.dtype)
    if self.positions.ndim == 3:
      new = jnp.broadcast_to(new, (3, *new.shape))
    return jnp.concatenate([self.positions, new], axis=-1)
