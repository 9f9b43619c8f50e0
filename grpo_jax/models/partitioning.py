"""Where each param goes on the mesh: the logical axes the models declare where each param is
defined, mapped to mesh axes by parallel/mesh.py's one rules table (LOGICAL_RULES).

The decoder declares its params' axes with `nn.with_logical_partitioning` (models/decoder.py
`param_axes`), LoRA derives its adapters' from the kernels they adapt (models/lora.py
`adapter_axes`), and the critic's value head and a reward model's score head declare theirs
beside their definitions. An optimizer state's leaves end with their param's path, so one
table places params, optimizer moments, the reference and the critic alike.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import param_axes
from grpo_jax.models.families import BLOCKS
from grpo_jax.models.lora import adapter_axes
from grpo_jax.models.reward_model import SCORE_AXES
from grpo_jax.models.value_head import HEAD_AXES
from grpo_jax.parallel import mesh as mesh_lib


def declared_axes() -> dict:
  """_declared_axes of the families registered now (a plugin's too)."""
  return _declared_axes(BLOCKS.names())


@functools.cache
def _declared_axes(families: tuple) -> dict:
  """{param path (a tuple of names): logical axes} of every param the models define: the
  decoder's, read from its modules at a small shape with every optional param on (q/k/v
  biases, q/k norms, an untied lm_head, and each registered family's own: Gemma's extra norms,
  a mixture's experts), LoRA's adapters, the value and score heads. A vision tower's are
  _vision_axes', read only for a path under "vision"."""
  every_param = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                            num_heads=1, num_kv_heads=1, head_dim=2, tie_embeddings=False,
                            qkv_bias=True, qk_norm=True)
  table = {}
  for name in families:
    cfg = dataclasses.replace(every_param, family=name, **BLOCKS.get(name).every_param())
    flat, _ = jax.tree_util.tree_flatten_with_path(
        param_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    table.update({tuple(k.key for k in path): axes for path, axes in flat})
  table.update(adapter_axes(table))
  table.update(HEAD_AXES)
  table.update(SCORE_AXES)
  return table


@functools.cache
def _vision_axes() -> dict:
  """A vision-language policy's tower (its params under "vision", models/vision/): the axes
  its modules declare (qwen2_5_vl.vision_param_axes), at a small shape. Its decoder's params
  (under "text") are the decoder's own paths, matched above."""
  from grpo_jax.models.vision.qwen2_5_vl import VisionConfig, vision_param_axes  # noqa: PLC0415
  small = VisionConfig(depth=1, hidden_size=8, intermediate_size=8, num_heads=1, patch_size=2,
                       window_size=8, out_hidden_size=8, fullatt_block_indexes=(0,))
  flat, _ = jax.tree_util.tree_flatten_with_path(vision_param_axes(small),
                                                 is_leaf=lambda x: isinstance(x, tuple))
  return {("vision",) + tuple(k.key for k in path): axes for path, axes in flat}


def axes_of(path: tuple, ndim: int) -> tuple:
  """The logical axes of the leaf at `path`: those declared for the longest param path that
  ends it (an optimizer moment's path ends with its param's), or replicated when none is
  declared or the rank differs (e.g. seeds stacked on a leading axis)."""
  table = declared_axes()
  vision = _vision_axes() if "vision" in path else {}  # its keys all start with "vision"
  for start in range(len(path)):
    axes = table.get(tuple(path[start:]), vision.get(tuple(path[start:])))
    if axes is not None:
      return axes if len(axes) == ndim else (None,) * ndim
  return (None,) * ndim


def shardings(tree, mesh):
  """NamedShardings of a params-like pytree (a whole TrainState included) by the rules."""
  return mesh_lib.tree_shardings(tree, mesh, axes_of)


def place(tree, mesh):
  """A params-like pytree put on the mesh by the rules (the tree itself when mesh is None)."""
  return tree if mesh is None else mesh_lib.place_tree(tree, mesh, axes_of)
