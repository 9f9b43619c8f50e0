"""The whole Qwen2.5-VL model's forward pass: token ids and images -> next-token logits, equal
to transformers 5's ``Qwen2_5_VLForConditionalGeneration`` (float32, 1e-4).

    logits = vlm_logits(params, input_ids, attention_mask, pixel_values, image_grid_thw, cfg)

1. image features: the vision encoder (qwen2_5_vl.encode_images) on the processor's
   pixel_values, (num_image_tokens, E);
2. input embeddings: the decoder's own lookup (prompt_inputs.embed_tokens) with the image features
   written at the image placeholder tokens in row-major order (placeholders.
   merge_image_features, HF's masked_scatter);
3. positions: the 3-D (temporal, height, width) ids of mrope.mrope_position_ids (HF's
   get_rope_index), padding skipped;
4. the text decoder: models/decoder.py's Decoder with the "qwen2_5_vl" blocks
   (families/qwen2_5_vl.py: Qwen2's, q and k rotated by mRoPE), the embeddings given as its
   prefix_embeddings. The same Decoder runs the teacher-forced passes, the prefill and the
   cached decode (rollout/), so the VLM has no decoder of its own.

The decoder's params are models/decoder.py's (``init_params(cfg.text, key)``), so the text
families' loading, sharding axes, LoRA and export tables apply to them; ``remat`` and
``logits_chunk`` on ``cfg.text`` are the text families' (memory, not maths).

Params: ``{"vision": encoder params, "text": decoder params}``; loading from Hugging Face:
qwen2_5_vl_model_hf.py; generation: rollout/vlm_sampler.py (the text engines).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import REMAT_POLICIES, decoder_apply, init_params
from grpo_jax.models.prompt_inputs import embed_tokens
from grpo_jax.models.vision.mrope import mrope_frequency_axes, mrope_position_ids
from grpo_jax.models.vision.placeholders import check_image_features, merge_image_features
from grpo_jax.models.vision.qwen2_5_vl import (VisionConfig, check_vision_config,
                                               encode_images, init_vision_params)


@dataclasses.dataclass(frozen=True)
class VlmConfig:
  """A Qwen2.5-VL model: its text decoder (a Qwen2 ModelConfig), its vision encoder, the
  mRoPE split of the head's frequencies (rope_parameters.mrope_section) and the image
  placeholder token id."""

  text: ModelConfig
  vision: VisionConfig
  mrope_section: tuple
  image_token_id: int = 151655
  # (t, gh, gw) patches of every image when the model is the RL loop's policy (one image size
  # per run; models/vision/policy.py); unused by the functions of this module.
  image_grid: tuple = (1, 2, 2)
  # False: the vision tower is frozen in RL (no update, no weight decay; model.vision.train_tower).
  train_tower: bool = True

  def __getattr__(self, name):
    """The text decoder's fields (vocab_size, dtype, num_experts, ...) read through: where the
    loop takes a model config, the VLM's is its decoder's plus the vision tower."""
    if name.startswith("__") or name in ("text", "vision"):
      raise AttributeError(name)
    return getattr(self.text, name)

  def __post_init__(self):
    mrope_frequency_axes(self.mrope_section, self.text.head_dim)  # ConfigError when it's off
    # The decoder is Qwen2's with mRoPE as its rotary function (families/qwen2_5_vl.py).
    object.__setattr__(self, "text", dataclasses.replace(
        self.text, family="qwen2_5_vl", mrope_section=tuple(self.mrope_section)))
    check_vision_config(self.vision)
    if self.text.remat not in REMAT_POLICIES:
      raise ConfigError(f"remat={self.text.remat!r}; use one of {', '.join(REMAT_POLICIES)}.")
    if int(self.text.logits_chunk) < 0:
      raise ConfigError(f"logits_chunk={self.text.logits_chunk}; use 0 (the completion in one "
                        f"piece) or a positive number of positions.")


def merged_embeddings(text_params, input_ids, image_features, cfg: VlmConfig) -> jax.Array:
  """(B, T, E) input embeddings: the decoder's lookup of input_ids with image_features (N, E),
  one row per image token of the batch (row-major), at the image placeholders."""
  return merge_image_features(embed_tokens(cfg.text, text_params, jnp.asarray(input_ids)),
                              input_ids, image_features, cfg.image_token_id)


@functools.partial(jax.jit, static_argnums=(5,))
def decoder_logits(text_params, input_ids, kv_mask, image_features, positions,
                   cfg: VlmConfig) -> jax.Array:
  """(B, T, vocab) float32 logits of the text decoder on merged_embeddings: input_ids (B, T),
  kv_mask (B, T) (False: padding, never attended to), image_features (N, E), positions
  (3, B, T) mRoPE ids."""
  x = merged_embeddings(text_params, input_ids, image_features, cfg)
  return decoder_apply(cfg.text, text_params, jnp.asarray(input_ids), jnp.asarray(positions),
                       jnp.asarray(kv_mask, bool), prefix_embeddings=x)[0]


def image_features(params, pixel_values, image_grid_thw, cfg: VlmConfig) -> jax.Array:
  """(num_image_tokens, E) encoder outputs of the images, or (0, E) without images."""
  if image_grid_thw is None or len(np.asarray(image_grid_thw).reshape(-1, 3)) == 0:
    return jnp.zeros((0, cfg.text.hidden_size), cfg.text.dtype)
  return encode_images(params["vision"], pixel_values, np.asarray(image_grid_thw), cfg.vision)


def vlm_logits(params, input_ids, attention_mask, pixel_values, image_grid_thw,
               cfg: VlmConfig) -> jax.Array:
  """(B, T, vocab) float32 logits of Qwen2.5-VL (module docstring), HF's
  ``Qwen2_5_VLForConditionalGeneration(...).logits``.

  input_ids (B, T) with the placeholders expanded (placeholders.expand_image_placeholders);
  attention_mask (B, T), 1 on real tokens (left or right padding; None: all real);
  pixel_values (N, C*T*P*P) and image_grid_thw (num_images, 3) from the image processor, the
  images in the order of their placeholder runs across the batch (None: no images). Host
  data: the positions and the checks run on the host (ConfigError before any compute)."""
  ids = np.asarray(input_ids)
  mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) > 0
  positions, _ = mrope_position_ids(ids, image_grid_thw, mask, image_token_id=cfg.image_token_id,
                                    merge_size=cfg.vision.spatial_merge_size)
  features = image_features(params, pixel_values, image_grid_thw, cfg)
  check_image_features(ids, features, image_token_id=cfg.image_token_id)
  return decoder_logits(params["text"], ids, mask, features, positions, cfg)


def init_vlm_params(cfg: VlmConfig, key: jax.Array):
  """Random params {"vision": ..., "text": ...} (the text decoder's as models/decoder.py's)."""
  vision_key, text_key = jax.random.split(key)
  return {"vision": init_vision_params(cfg.vision, vision_key),
          "text": init_params(cfg.text, text_key)}
