"""Hugging Face tensor names <-> our params (models/hf.py loads and models/hf_export.py
writes through these): one HFTensor per Hugging Face tensor, naming the param path and its
index on the stacked layer axis (and on a mixture's expert axis) it fills.

Names map one to one (``model.layers.3.self_attn.q_proj.weight`` <-> layer 3 of the stacked
``layers/self_attn/q_proj/kernel``; ``model.layers.3.mlp.experts.5.up_proj.weight`` <-> expert 5
of layer 3 of ``layers/mlp/experts/up_proj/kernel``). Dense kernels are stored (out, in) by
torch and (in, out) here; the attention kernels keep their heads as a dimension here.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import init_params
from grpo_jax.models.lora import input_dims


def _hf_name(path: tuple, layer: Optional[int], expert: Optional[int] = None) -> str:
  """Our param path (and its index on the layer axis, and on the expert axis of a mixture's
  stacked experts) -> its Hugging Face tensor name."""
  *modules, leaf = path
  if layer is not None:
    modules = [f"layers.{layer}" if m == "layers" else m for m in modules]
  if expert is not None:
    modules = [f"experts.{expert}" if m == "experts" else m for m in modules]
  prefix = [] if modules[0] == "lm_head" else ["model"]
  hf_leaf = "weight" if leaf in ("kernel", "embedding") else leaf
  return ".".join(prefix + modules + [hf_leaf])


def _hf_shape(path: tuple, shape: tuple) -> tuple:
  """The torch shape of a param: a kernel (in dims..., out dims...) is (out, in) flattened, a
  per-head bias (heads, head_dim) is flat, the rest as ours."""
  if path[-1] == "kernel":
    k = input_dims(path[-2])
    return (math.prod(shape[k:]), math.prod(shape[:k]))
  return (math.prod(shape),) if path[-1] == "bias" else shape


def _from_hf(array: np.ndarray, path: tuple, shape: tuple) -> np.ndarray:
  return array.T.reshape(shape) if path[-1] == "kernel" else array.reshape(shape)


def to_hf(array: np.ndarray, path: tuple) -> np.ndarray:
  if path[-1] == "kernel":
    k = input_dims(path[-2])
    return array.reshape(math.prod(array.shape[:k]), -1).T
  return array.reshape(-1) if path[-1] == "bias" else array


class HFTensor(NamedTuple):
  """One Hugging Face tensor and where it lives in our params."""
  path: tuple  # the param's path in our tree ("layers", "self_attn", "q_proj", "kernel")
  layer: Optional[int]  # its index on the stacked layer axis; None outside the layers
  name: str  # Hugging Face's name, "model.layers.3.self_attn.q_proj.weight"
  hf_shape: tuple  # torch's shape
  shape: tuple  # ours (of one layer; of one expert)
  expert: Optional[int] = None  # its index on a mixture's expert axis (models/moe.py)


def param_layout(model_cfg: ModelConfig):
  """([HFTensor] in the params' tree order, a stacked param's layers in order; the params'
  treedef)."""
  shapes = jax.eval_shape(functools.partial(init_params, model_cfg), jax.random.key(0))
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  layout = []
  for key_path, leaf in flat:
    path = tuple(k.key for k in key_path)
    stacked = path[0] == "layers"
    shape = tuple(leaf.shape[1:] if stacked else leaf.shape)
    per_expert = model_cfg.blocks.per_expert(path)  # one tensor per expert (the family's format)
    one = shape[1:] if per_expert else shape
    for layer in (range(leaf.shape[0]) if stacked else [None]):
      for e in (range(shape[0]) if per_expert else [None]):
        layout.append(HFTensor(path, layer, _hf_name(path, layer, e), _hf_shape(path, one), one, e))
  return layout, treedef


def params_from_hf(layout: list, treedef, arrays: dict, dtype):
  """Our params (jax arrays in dtype) from {HF name: array in our per-layer shape}; a stacked
  param is filled layer by layer."""
  leaves, experts = {}, {}
  for t in layout:
    leaves.setdefault(t.path, []).append(arrays[t.name])
    if t.expert is not None:  # (layers x experts) parts -> (layers, experts, ...)
      experts[t.path] = (t.layer + 1, t.expert + 1)
  def whole(path, parts):
    if path in experts:
      return np.stack(parts).reshape(*experts[path], *parts[0].shape)
    return np.stack(parts) if path[0] == "layers" else parts[0]
  return jax.tree.unflatten(treedef, [jnp.asarray(whole(path, parts), dtype=dtype)
                                      for path, parts in leaves.items()])


def hf_arrays(layout: list, params):
  """[(HFTensor, our array of that tensor (one layer's slice of a stacked param))], in layout
  order, from params of `layout`'s structure."""
  leaves = dict(zip(dict.fromkeys(t.path for t in layout), jax.tree.leaves(params)))
  out = []
  for t in layout:
    leaf = np.asarray(jax.device_get(leaves[t.path]))
    leaf = leaf if t.layer is None else leaf[t.layer]
    out.append((t, leaf if t.expert is None else leaf[t.expert]))
  return out
