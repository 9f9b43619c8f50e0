"""Qwen2.5-VL's vision encoder (transformers' ``Qwen2_5_VisionTransformerPretrainedModel``) in
Flax: images, as Hugging Face's image processor gives them, to the language model's image
tokens.

``encode_images(params, pixel_values, grid_thw, cfg) -> (num_image_tokens, out_hidden_size)``

* ``pixel_values`` (N, C*T*P*P): the processor's flattened patches (C channels, T =
  temporal_patch_size frames, P x P pixels, in that order), merge-block-major
  (qwen2_5_vl_layout.py); N = sum of t*h*w over the images.
* ``grid_thw`` (num_images, 3): the processor's ``image_grid_thw``, host data (NumPy), so the
  layout is computed on the host and the shapes are static per call.
* the result: one row per m x m patches (m = spatial_merge_size), images in order, in the
  processor's order: num_image_tokens = N / m^2, the number of image placeholders the
  language model's prompt holds.

What it computes (HF's names in brackets):

1. patch embedding [``patch_embed.proj``, a Conv3d whose kernel equals its stride]: one matmul
   x = pixel_values @ W, W (C*T*P*P, hidden) the conv's weight flattened.
2. the tokens permuted by windows: units of m*m tokens in ``window_index`` order.
3. 2-D RoPE on q and k [``rotary_pos_emb``]: with f = theta^(-2i/(d/2)), i < d/4 (d = head
   dim), a patch at (row, col) rotates by angles concat(row*f, col*f) repeated twice, with
   rotate_half, over the whole head.
4. ``depth`` pre-norm blocks [``blocks.N``]: x += proj(attn(norm1(x))) with fused ``qkv`` and
   biases, softmax(q k^T / sqrt(d)) within a frame in the ``fullatt_block_indexes`` blocks and
   within a window elsewhere; then x += down(act(gate(norm2(x))) * up(norm2(x))), with biases.
   RMSNorm y = x / sqrt(mean(x^2) + 1e-6) * weight.
5. the patch merger [``merger``]: RMSNorm [``ln_q``], each unit's m*m tokens concatenated,
   Linear [``mlp.0``], exact GELU, Linear [``mlp.2``] to out_hidden_size; then the units put
   back in the processor's order (argsort of window_index).

Params (a plain nested dict; kernels (in, out) with heads as a dimension, the blocks stacked
on a leading axis like the decoder's layers; vision_param_axes gives their logical axes):
``patch_embed/proj/kernel`` (C*T*P*P, D); ``blocks/{norm1,norm2}/weight`` (L, D);
``blocks/attn/qkv/{kernel (L, D, 3, H, d), bias (L, 3, H, d)}``;
``blocks/attn/proj/{kernel (L, H, d, D), bias (L, D)}``;
``blocks/mlp/{gate_proj,up_proj}/{kernel (L, D, I), bias (L, I)}``,
``blocks/mlp/down_proj/{kernel (L, I, D), bias (L, D)}``; ``merger/ln_q/weight`` (D,),
``merger/mlp_0/{kernel (m^2 D, m^2 D), bias}``, ``merger/mlp_2/{kernel (m^2 D, out), bias}``.
Hugging Face's tensor names: qwen2_5_vl_hf.py.

Attention is blocked by segment (segment_attention): the segments (frames, or windows), each a
contiguous run of the window order, are grouped by length (qwen2_5_vl_layout.segment_blocks)
and each group attends as one (segments, heads, len, len) batch, so memory grows with the sum
of the segments' squared lengths, never with N^2. A block picks its layout with lax.cond under
jax.checkpoint: the backward pass keeps q, k, v and recomputes the scores, so the scan's
saved residuals do not hold both layouts' probabilities for every block.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.models.blocks import RMSNorm, normal_init, with_axes
from grpo_jax.models.attention import apply_rotation
from grpo_jax.models.vision.qwen2_5_vl_layout import patch_layout, segment_blocks

# config.json's hidden_act -> the function (transformers' ACT2FN names).
ACTIVATIONS: dict[str, Callable] = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """Qwen2_5_VLVisionConfig's fields (same names; num_heads, depth)."""
  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  in_channels: int = 3
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112
  out_hidden_size: int = 2048
  fullatt_block_indexes: tuple = (7, 15, 23, 31)
  hidden_act: str = "silu"
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6  # fixed in transformers
  param_dtype: str = "float32"
  compute_dtype: str = "float32"

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """C*T*P*P: the length of one row of pixel_values."""
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def window_units(self) -> int:
    """A window's side in merged units: window_size // spatial_merge_size // patch_size."""
    return self.window_size // self.spatial_merge_size // self.patch_size


def check_vision_config(cfg: VisionConfig) -> VisionConfig:
  """cfg, or one sentence naming the field that cannot work and the fix."""
  if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 4:
    raise ConfigError(f"vision hidden_size={cfg.hidden_size} with num_heads={cfg.num_heads} "
                      f"gives head_dim {cfg.hidden_size / cfg.num_heads}; the 2-D RoPE needs "
                      f"a whole head_dim divisible by 4: change one of them.")
  if cfg.window_units < 1:
    raise ConfigError(f"vision window_size={cfg.window_size} is under spatial_merge_size * "
                      f"patch_size = {cfg.spatial_merge_size * cfg.patch_size}; use a window "
                      f"of at least one merged unit.")
  if cfg.hidden_act not in ACTIVATIONS:
    raise ConfigError(f"vision hidden_act={cfg.hidden_act!r} is unknown; valid: "
                      f"{', '.join(sorted(ACTIVATIONS))}.")
  bad = [i for i in cfg.fullatt_block_indexes if not 0 <= i < cfg.depth]
  if bad:
    raise ConfigError(f"vision fullatt_block_indexes {bad} are outside depth={cfg.depth}; "
                      f"list block indexes 0..{cfg.depth - 1}.")
  return cfg


# Older Qwen2.5-VL config.json names (the released checkpoints' vision_config) -> ours.
_CONFIG_ALIASES = {"in_chans": "in_channels"}


def vision_config_from_hf(hf_config: dict, param_dtype: str = "float32",
                          compute_dtype: str = "float32") -> VisionConfig:
  """The VisionConfig of a Qwen2.5-VL config.json (its ``vision_config``) or of that section
  alone (``Qwen2_5_VLVisionConfig.to_dict()``)."""
  vision = dict(hf_config.get("vision_config", hf_config))
  for alias, name in _CONFIG_ALIASES.items():
    vision.setdefault(name, vision.get(alias))
  fields = {f.name for f in dataclasses.fields(VisionConfig)} - {
      "rope_theta", "rms_norm_eps", "param_dtype", "compute_dtype"}
  values = {k: vision[k] for k in fields if vision.get(k) is not None}
  if "fullatt_block_indexes" in values:
    values["fullatt_block_indexes"] = tuple(values["fullatt_block_indexes"])
  rope = vision.get("rope_parameters") or {}
  return check_vision_config(VisionConfig(
      **values, rope_theta=float(rope.get("rope_theta", vision.get("rope_theta", 10000.0))),
      param_dtype=param_dtype, compute_dtype=compute_dtype))


def rotary_cos_sin(positions: jax.Array, cfg: VisionConfig):
  """(cos, sin), each (N, head_dim) float32, of the 2-D RoPE at (row, col) positions (N, 2):
  angles concat(row * f, col * f) twice, f = theta^(-arange(0, d/2, 2) / (d/2))."""
  half = cfg.head_dim // 2
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
  angles = (positions[..., None].astype(jnp.float32) * inv_freq).reshape(len(positions), -1)
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def vision_norm(cfg: VisionConfig, name: str) -> RMSNorm:
  """The encoder's RMSNorm (models/blocks.py's, eps 1e-6, weight axes ("norm",))."""
  return RMSNorm(cfg.rms_norm_eps, jnp.dtype(cfg.param_dtype), name=name)


class Linear(nn.Module):
  """y = x . kernel + bias, contracting x's last len(in_shape) dims: kernel in_shape +
  out_shape, bias out_shape, each dim under its logical axis name."""
  in_shape: tuple
  out_shape: tuple
  in_axes: tuple
  out_axes: tuple
  cfg: VisionConfig
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    dtype = jnp.dtype(self.cfg.compute_dtype)
    kernel = self.param("kernel", with_axes(normal_init, *self.in_axes, *self.out_axes),
                        self.in_shape + self.out_shape, jnp.dtype(self.cfg.param_dtype))
    y = jnp.tensordot(x.astype(dtype), kernel.astype(dtype), axes=len(self.in_shape))
    if self.use_bias:
      bias = self.param("bias", with_axes(nn.initializers.zeros_init(), *self.out_axes),
                        self.out_shape, jnp.dtype(self.cfg.param_dtype))
      y = y + bias.astype(dtype)
    return y


def segment_attention(q, k, v, blocks: tuple):
  """softmax(q k^T / sqrt(d)) v within each segment, for q, k, v (N, heads, d) in the window
  order and blocks = (groups, inverse) of a SegmentBlocks: per group of n segments of length
  L, scores (n, heads, L, L) in float32 (q k^T in q's dtype, then cast, as the dense form),
  the outputs concatenated over groups and put back in token order by inverse."""
  groups, inverse = blocks
  scale = math.sqrt(q.shape[-1])
  outs = []
  for index in groups:
    qs, ks, vs = q[index], k[index], v[index]  # (n, L, heads, d)
    scores = jnp.einsum("nqhd,nkhd->nhqk", qs, ks).astype(jnp.float32) / scale
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    outs.append(jnp.einsum("nhqk,nkhd->nqhd", probs, vs).reshape(-1, *q.shape[1:]))
  return jnp.concatenate(outs)[inverse]


@jax.checkpoint
def frame_or_window_attention(is_full, q, k, v, frame_blocks, window_blocks):
  """segment_attention within frames if is_full (a traced bool), else within windows;
  checkpointed, so a scan's backward saves q, k, v rather than both branches' probabilities."""
  return jax.lax.cond(is_full, lambda q, k, v: segment_attention(q, k, v, frame_blocks),
                      lambda q, k, v: segment_attention(q, k, v, window_blocks), q, k, v)


class VisionAttention(nn.Module):
  """[attn] Bidirectional attention within segments (frames if is_full, else windows): fused
  qkv, the 2-D RoPE on q and k, softmax in float32 (segment_attention), out proj."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, x, cos, sin, is_full, frame_blocks, window_blocks):
    cfg = self.cfg
    dim, heads, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    qkv = Linear((dim,), (3, heads, d), ("embed",), (None, "heads", "head_dim"), cfg,
                 name="qkv")(x)
    q, k, v = (qkv[:, i] for i in range(3))
    q, k = (apply_rotation(a, cos[:, None], sin[:, None]) for a in (q, k))  # over the heads
    attended = frame_or_window_attention(is_full, q, k, v, frame_blocks, window_blocks)
    return Linear((heads, d), (dim,), ("heads", "head_dim"), ("embed",), cfg,
                  name="proj")(attended)


class VisionMLP(nn.Module):
  """[mlp] down(act(gate(x)) * up(x)), each Linear with a bias."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dim, inter = cfg.hidden_size, cfg.intermediate_size
    gate = Linear((dim,), (inter,), ("embed",), ("mlp",), cfg, name="gate_proj")(x)
    up = Linear((dim,), (inter,), ("embed",), ("mlp",), cfg, name="up_proj")(x)
    hidden = ACTIVATIONS[cfg.hidden_act](gate) * up
    return Linear((inter,), (dim,), ("mlp",), ("embed",), cfg, name="down_proj")(hidden)


class VisionBlock(nn.Module):
  """One pre-norm ViT block [blocks.N]: x + attn(norm1(x)), then + mlp(norm2(x)); attention
  within frames in a full-attention block (is_full), within windows elsewhere."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, x, is_full, cos, sin, frame_blocks, window_blocks):
    cfg = self.cfg
    x = x + VisionAttention(cfg, name="attn")(vision_norm(cfg, "norm1")(x), cos, sin, is_full,
                                              frame_blocks, window_blocks)
    return x + VisionMLP(cfg, name="mlp")(vision_norm(cfg, "norm2")(x)), None


class PatchEmbed(nn.Module):
  """[patch_embed] The Conv3d with kernel = stride = (T, P, P) as one matmul on the
  processor's flattened patches: (N, C*T*P*P) @ (C*T*P*P, D), no bias."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, pixel_values):
    cfg = self.cfg
    return Linear((cfg.patch_dim,), (cfg.hidden_size,), (None,), ("embed",), cfg,
                  use_bias=False, name="proj")(pixel_values)


class PatchMerger(nn.Module):
  """[merger] RMSNorm, m*m tokens concatenated per unit, Linear, exact GELU, Linear."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    wide = cfg.hidden_size * cfg.spatial_merge_size ** 2
    x = vision_norm(cfg, "ln_q")(x).reshape(-1, wide)
    x = Linear((wide,), (wide,), ("embed",), ("mlp",), cfg, name="mlp_0")(x)
    x = jax.nn.gelu(x, approximate=False)
    return Linear((wide,), (cfg.out_hidden_size,), ("mlp",), ("embed",), cfg, name="mlp_2")(x)


class VisionEncoder(nn.Module):
  """The whole encoder on one call's patches, given its host layout (see the module
  docstring); the blocks are one nn.scan over a leading "layers" axis."""
  cfg: VisionConfig

  @nn.compact
  def __call__(self, pixel_values, window_index, reverse_index, positions, frame_blocks,
               window_blocks):
    cfg = self.cfg
    unit = cfg.spatial_merge_size ** 2
    x = PatchEmbed(cfg, name="patch_embed")(pixel_values)
    x = x.reshape(-1, unit, cfg.hidden_size)[window_index].reshape(-1, cfg.hidden_size)
    cos, sin = rotary_cos_sin(positions, cfg)
    is_full = jnp.asarray([i in cfg.fullatt_block_indexes for i in range(cfg.depth)])
    blocks = nn.scan(VisionBlock, variable_axes={"params": 0}, split_rngs={"params": True},
                     in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                     length=cfg.depth, metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = blocks(cfg, name="blocks")(x, is_full, cos, sin, frame_blocks, window_blocks)
    return PatchMerger(cfg, name="merger")(x)[reverse_index]


def _layout_arrays(grid_thw, cfg: VisionConfig) -> tuple:
  """VisionEncoder's layout inputs (NumPy) for these image grids: window_index, reverse_index,
  positions, then the frames' and the windows' SegmentBlocks as (groups, inverse) tuples."""
  layout = patch_layout(grid_thw, cfg.spatial_merge_size, cfg.window_units)
  frames, windows = segment_blocks(layout.frame_segments), segment_blocks(layout.window_segments)
  return (layout.window_index, layout.reverse_index, layout.positions,
          (frames.groups, frames.inverse), (windows.groups, windows.inverse))


@functools.partial(jax.jit, static_argnums=(2,))
def _encode(params, pixel_values, cfg: VisionConfig, layout: tuple):
  return VisionEncoder(cfg).apply({"params": params}, pixel_values, *layout)


def encode_images(params, pixel_values, grid_thw, cfg: VisionConfig) -> jax.Array:
  """(num_image_tokens, out_hidden_size) image tokens of the processor's pixel_values (N,
  C*T*P*P) and image_grid_thw (num_images, 3) (host data); see the module docstring."""
  check_vision_config(cfg)
  layout = _layout_arrays(grid_thw, cfg)
  expected = (len(layout[2]), cfg.patch_dim)
  if tuple(np.shape(pixel_values)) != expected:
    raise ConfigError(f"pixel_values has shape {tuple(np.shape(pixel_values))} but "
                      f"image_grid_thw and the vision config need {expected}; pass the "
                      f"processor's pixel_values with its own image_grid_thw.")
  return _encode(params, jnp.asarray(pixel_values), cfg, layout)


def _dummy_inputs(cfg: VisionConfig) -> tuple:
  m = cfg.spatial_merge_size
  grid = np.array([[1, m, m]])
  return (jnp.zeros((m * m, cfg.patch_dim), jnp.float32), *_layout_arrays(grid, cfg))


def init_vision_params(cfg: VisionConfig, key: jax.Array):
  """Random params (a plain nested dict, the blocks stacked on a leading axis)."""
  check_vision_config(cfg)
  inputs = _dummy_inputs(cfg)
  return jax.jit(lambda k: nn.unbox(VisionEncoder(cfg).init(k, *inputs)["params"]))(key)


def vision_param_axes(cfg: VisionConfig):
  """The params' logical axis names as declared where each is defined: a tree shaped like
  init_vision_params(cfg, key) of tuples (("layers", "embed", None, "heads", "head_dim"), ...)."""
  boxed = jax.eval_shape(lambda key: VisionEncoder(cfg).init(key, *_dummy_inputs(cfg))["params"],
                         jax.random.key(0))
  return jax.tree.map(lambda b: tuple(b.names), boxed,
                      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
