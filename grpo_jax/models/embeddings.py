"""The decoder's two ends and what feeds them: the token embedding table and its lookup, an
embedding prefix at the first positions (a vision-language prompt's), the vocabulary head, and
the right padding that lets a row split evenly over the mesh's `context` axis
(models/decoder.py's Decoder calls them)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from grpo_jax.models.blocks import normal_init, with_axes
from grpo_jax.models.config import ModelConfig
from grpo_jax.parallel.mesh import constrain


def pad_tokens(x, pad: int):
  """x padded with `pad` zeros (False) at the end of its last axis (the tokens')."""
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])


def embedding(cfg: ModelConfig) -> nn.Embed:
  """The token embedding table (vocab x embed), Hugging Face's `embed_tokens`."""
  return nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  embedding_init=with_axes(normal_init, "vocab", "embed"), name="embed_tokens")


def lookup(embed: nn.Embed, tokens, dtype):
  """embed(tokens) from the whole table: on a mesh the table is gathered first (replicated),
  so that the rows of the lookup follow the tokens' split over data x fsdp rather than the
  table's over vocab x embed. The same values; XLA otherwise does the same gather by itself
  and warns once per program ("[SPMD] Involuntary full rematerialization")."""
  table = constrain(jnp.asarray(embed.embedding, dtype), (None, None))
  return jnp.take(table, tokens, axis=0)


def with_prefix(x, prefix):
  """x (B, T, E) with its first P' positions replaced by prefix (B, P', E)."""
  prefix = constrain(prefix.astype(x.dtype), ("batch", "length", None))
  if prefix.shape[1] == x.shape[1]:
    return prefix
  return jnp.concatenate([prefix, x[:, prefix.shape[1]:]], axis=1)


def lm_head(cfg: ModelConfig) -> nn.Dense:
  """The untied vocabulary projection (embed x vocab), Hugging Face's `lm_head`."""
  return nn.Dense(cfg.vocab_size, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  kernel_init=with_axes(normal_init, "embed", "vocab"), name="lm_head")
