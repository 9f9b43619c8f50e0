"""Qwen2.5-VL vision encoder params <-> Hugging Face's tensor names.

transformers 5.x names the encoder's tensors ``model.visual.*`` (Qwen2_5_VLForConditionalGeneration)
or ``visual.*`` (4.x checkpoints, and Qwen2_5_VLModel under no prefix); the encoder alone
(Qwen2_5_VisionTransformerPretrainedModel) has none. Per tensor (L = depth, i < L):

    patch_embed.proj.weight (D, C, T, P, P)  <-> patch_embed/proj/kernel (C*T*P*P, D)
    blocks.i.norm1.weight, blocks.i.norm2.weight (D,)  <-> blocks/norm{1,2}/weight [i]
    blocks.i.attn.qkv.weight (3D, D), .bias (3D,)  <-> blocks/attn/qkv/kernel [i] (D, 3, H, d)
    blocks.i.attn.proj.weight (D, D), .bias  <-> blocks/attn/proj/kernel [i] (H, d, D)
    blocks.i.mlp.{gate,up,down}_proj.weight, .bias  <-> blocks/mlp/..._proj/kernel [i] (in, out)
    merger.ln_q.weight; merger.mlp.0.weight, .bias; merger.mlp.2.weight, .bias
      <-> merger/ln_q/weight; merger/mlp_0/...; merger/mlp_2/...

A Linear's weight (out, in...) is our kernel (in..., out...) transposed and reshaped; a
"kernel"'s leading in-dims are 1 except attn/proj's (H, d).
"""

from __future__ import annotations

import math
from typing import Mapping

import jax
import numpy as np

from grpo_jax.errors import InputError
from grpo_jax.models.vision.qwen2_5_vl import VisionConfig, init_vision_params

PREFIXES = ("model.visual.", "visual.", "")  # transformers 5.x, 4.x / Qwen2_5_VLModel, alone
_IN_DIMS = {("attn", "proj", "kernel"): 2}  # a kernel's leading input dims (else 1)
_HF_PIECES = {"kernel": "weight", "mlp_0": "mlp.0", "mlp_2": "mlp.2"}


def _param_shapes(cfg: VisionConfig) -> tuple:
  """({param path: shape} of the encoder's params, in tree order; the params' treedef)."""
  shapes = jax.eval_shape(lambda k: init_vision_params(cfg, k), jax.random.key(0))
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  return {tuple(k.key for k in path): leaf.shape for path, leaf in flat}, treedef


def _hf_name(path: tuple, layer) -> str:
  """The HF name (no prefix) of our param at path, of block `layer` when stacked."""
  pieces = [_HF_PIECES.get(p, p) for p in path]
  if layer is not None:
    pieces.insert(1, str(layer))
  return ".".join(pieces)


def _hf_shape(path: tuple, shape: tuple, cfg: VisionConfig) -> tuple:
  """The HF tensor's shape for our (unstacked) param of this shape."""
  if path[-1] != "kernel":
    return (math.prod(shape),)
  if path[0] == "patch_embed":
    return (cfg.hidden_size, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size,
            cfg.patch_size)
  n_in = _IN_DIMS.get(path[-3:], 1)
  return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))


def tensor_prefix(names, prefixes, probe: str, missing: str) -> str:
  """The first of `prefixes` under which `probe` is among the tensor names, or an InputError
  saying `missing` (a part of a Qwen2.5-VL state dict: its encoder, its decoder)."""
  names = set(names)
  for prefix in prefixes:
    if prefix + probe in names:
      return prefix
  raise InputError(missing)


# The encoder's tensors are missing: one sentence.
VISION_MISSING = ("the state dict has no Qwen2.5-VL vision encoder (no model.visual.*, visual.* "
                  "or patch_embed.proj.weight tensor); load a Qwen2.5-VL checkpoint.")


def vision_params_from_hf(tensors: Mapping, cfg: VisionConfig, dtype=np.float32):
  """Our encoder params (a nested dict of NumPy arrays, blocks stacked) from a state dict
  {HF name: array-like}, at whichever prefix it uses; a missing or misshapen tensor is one
  sentence naming it."""
  prefix = tensor_prefix(tensors.keys(), PREFIXES, "patch_embed.proj.weight", VISION_MISSING)
  shapes, treedef = _param_shapes(cfg)
  leaves = []
  for path, shape in shapes.items():
    stacked = path[0] == "blocks"
    layers = range(cfg.depth) if stacked else [None]
    one_shape = shape[1:] if stacked else shape
    arrays = []
    for layer in layers:
      name = prefix + _hf_name(path, layer)
      want = _hf_shape(path, one_shape, cfg)
      if name not in tensors:
        raise InputError(f"the state dict lacks {name}; load a complete Qwen2.5-VL checkpoint "
                         f"whose vision_config matches.")
      array = np.asarray(tensors[name], dtype=dtype)
      if array.shape != want:
        raise InputError(f"{name} has shape {array.shape}, the vision config needs {want}; "
                         f"use the config.json that came with the checkpoint.")
      if path[-1] == "kernel":
        array = array.reshape(array.shape[0], -1).T
      arrays.append(array.reshape(one_shape))
    leaves.append(np.stack(arrays) if stacked else arrays[0])
  return jax.tree.unflatten(treedef, leaves)


def vision_params_to_hf(params, cfg: VisionConfig, prefix: str = "model.visual.") -> dict:
  """{HF name: NumPy array} of our encoder params (the inverse of vision_params_from_hf)."""
  out = {}
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  for path, leaf in flat:
    path = tuple(k.key for k in path)
    leaf = np.asarray(leaf)
    stacked = path[0] == "blocks"
    for layer, one in (enumerate(leaf) if stacked else [(None, leaf)]):
      want = _hf_shape(path, one.shape, cfg)
      if path[-1] == "kernel":
        n_in = _IN_DIMS.get(path[-3:], 1)
        one = one.reshape(math.prod(one.shape[:n_in]), -1).T
      out[prefix + _hf_name(path, layer)] = np.ascontiguousarray(one.reshape(want))
  return out
