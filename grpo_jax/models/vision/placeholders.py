"""Image placeholders in the token ids of a Qwen2.5-VL prompt: their expansion (NumPy, the
processor's rule) and the merge of the image features into the text embeddings (JAX, the
model's rule), as transformers 5 defines them.

Expansion (HF's `Qwen2_5_VLProcessor.replace_image_token`): the chat template writes one
`<|image_pad|>` per image between `<|vision_start|>` and `<|vision_end|>`; the processor
replaces the i-th of them, counted across the batch in order, by

    image_grid_thw[i].prod() // merge_size^2 = t * h * w / merge_size^2

copies (the patches the vision encoder's merger leaves), merge_size = the image processor's
`merge_size` (2 for Qwen2.5-VL).

Merge (HF's `get_placeholder_mask` then `inputs_embeds.masked_scatter(image_mask,
image_embeds)`): the j-th image token of the batch, counted row by row and left to right, gets
row j of the image features (num_image_tokens, hidden), the images' merger outputs concatenated
in image order; every other position keeps its text embedding.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.mrope import image_token_count


def expand_image_placeholders(rows: Sequence[Sequence[int]], image_grid_thw, *,
                              image_token_id: int, merge_size: int = 2) -> list[np.ndarray]:
  """Each row's token ids (int64) with its i-th `<|image_pad|>` (the i-th across the rows, in
  order) repeated image_token_count(image_grid_thw[i], merge_size) times. A number of
  placeholders other than the number of images is a ConfigError."""
  grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else (
      np.asarray(image_grid_thw, np.int64).reshape(-1, 3))
  rows = [np.asarray(row, np.int64).reshape(-1) for row in rows]
  found = sum(int((row == image_token_id).sum()) for row in rows)
  if found != len(grids):
    raise ConfigError(f"the rows hold {found} image placeholders (token id {image_token_id}) "
                      f"but image_grid_thw has {len(grids)} images; pass one image per "
                      f"placeholder, in order.")
  counts = iter([image_token_count(g, merge_size) for g in grids])
  expanded = []
  for row in rows:
    repeats = np.ones(row.shape, np.int64)
    for index in np.flatnonzero(row == image_token_id):
      repeats[index] = next(counts)
    expanded.append(np.repeat(row, repeats))
  return expanded


def check_image_features(input_ids, image_features, *, image_token_id: int) -> None:
  """On the host, before merge_image_features: the batch's image tokens must number the rows of
  the image features (HF's "Image features and image tokens do not match"); a ConfigError
  otherwise."""
  tokens = int((np.asarray(input_ids) == image_token_id).sum())
  rows = int(np.shape(image_features)[0])
  if tokens != rows:
    raise ConfigError(f"the batch holds {tokens} image tokens but the image features have "
                      f"{rows} rows; expand the placeholders with expand_image_placeholders "
                      f"for the same image_grid_thw the encoder saw.")


def merge_image_features(embeddings: jax.Array, input_ids: jax.Array, image_features: jax.Array,
                         image_token_id: int) -> jax.Array:
  """(B, T, E) embeddings with the j-th image token of the batch (row-major) replaced by
  image_features[j] (HF's masked_scatter; module docstring), in the embeddings' dtype.

  embeddings (B, T, E); input_ids (B, T); image_features (N, E), N = the batch's image tokens
  (check_image_features checks it on the host; inside jit surplus rows are unused and a
  shortfall repeats the last row). Pure and jit-compatible: the scatter is a gather by the
  running count of image tokens.
  """
  is_image = jnp.asarray(input_ids) == image_token_id
  if image_features.shape[0] == 0:
    return embeddings
  order = jnp.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1  # (B, T)
  order = jnp.clip(order, 0, image_features.shape[0] - 1)
  gathered = jnp.take(image_features.astype(embeddings.dtype), order, axis=0)  # (B, T, E)
  return jnp.where(is_image[..., None], gathered, embeddings)
