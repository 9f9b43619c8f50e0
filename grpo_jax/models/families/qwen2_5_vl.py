"""Qwen2.5-VL's text decoder: Qwen2 on Llama's blocks, with multimodal RoPE (mRoPE) as its
rotary function. Each position has three ids (temporal, height, width; models/vision/mrope.py
computes them from the image placeholders); the head's frequencies are split by
``mrope_section`` (ModelConfig.mrope_section, config.json's rope_parameters.mrope_section) and
chunk i reads id i % 3. Positions given as (B, T) (a text-only row, or a decode step) are the
same id on the three axes, where mRoPE is plain RoPE.

Its params, tensor names and checkpoints are Qwen2's; only the rotation differs, so a
vision-language policy's text decoder is models/decoder.py's Decoder with these blocks
(models/vision/qwen2_5_vl_model.py VlmConfig picks them)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from grpo_jax.models.blocks import Blocks
from grpo_jax.models.families.registry import register_blocks
from grpo_jax.models.vision.mrope import apply_mrope


class MropeBlocks(Blocks):
  """Llama's blocks with mRoPE: positions (3, B, T), or (B, T) for one id on every axis."""

  name = "qwen2_5_vl"

  def rotary(self, cfg, x, positions):
    if positions.ndim == 2:
      positions = jnp.broadcast_to(positions, (3, *positions.shape))
    # inv_freq (D / 2,) and attention factor: the config's rope type, or the default
    # theta^(-2i / D) computed in float32 NumPy, as transformers computes it.
    inv_freq, factor = cfg.rope_frequencies()
    if inv_freq is None:
      exponents = np.arange(0, cfg.head_dim, 2, dtype=np.float32) / np.float32(cfg.head_dim)
      inv_freq = np.float32(1.0) / np.power(np.float32(cfg.rope_theta), exponents)
    return apply_mrope(x, positions, inv_freq, cfg.mrope_section, factor)

  def export_model_type(self, cfg) -> str:
    return "qwen2"

  def every_param(self) -> dict:
    return {"mrope_section": (1,)}  # (the axes table's model has head_dim 2)


register_blocks(MropeBlocks())
