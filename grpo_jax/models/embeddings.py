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
  """embed(tokens), each device reading its own slice of the table's model dimension: the ids go to
  every device that holds a slice of it (the axes of `embed`, fsdp x context; still split over the
  others), and each device looks up its columns of their rows. The caller's layout (rows and tokens
  split, the model dimension whole) then comes from two all-to-alls of the (rows, tokens, embed)
  values, one mesh axis each. The table is never gathered, and its gradient is a scatter-add into
  each device's own slice: at Qwen2.5-7B's shape (a 152,064 x 3,584 table) a whole table and a whole
  float32 gradient per device were 3.9 GiB of the update's peak (docs/meshes.md). The same values as
  a lookup in the whole table."""
  table = jnp.asarray(embed.embedding, dtype)
  rows = constrain(tokens, ("batch_beside_embed", None))
  x = constrain(jnp.take(table, rows, axis=0), ("batch_beside_embed", None, "embed"))
  # one mesh axis at a time (XLA's partitioner moves one axis by an all-to-all; two at once
  # it gathers): the rows' axes first, then the caller's constraint moves `length`'s.
  return constrain(x, ("batch", None, "embed_beside_batch"))


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
