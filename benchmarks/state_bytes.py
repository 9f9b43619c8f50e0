"""The train state's bytes at real shapes without allocating it (benchmarks/scale.py's
`--what state`): full fine-tuning against LoRA, in total or per device under a mesh."""

from __future__ import annotations

import json
import math

GIB = 2 ** 30


def tree_gib(tree) -> float:
  import jax
  return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)) / GIB


def per_device_gib(tree, shardings) -> float:
  """The most loaded device's bytes of `tree` under `shardings` (from shard shapes)."""
  import jax
  per = {}
  for leaf, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    nbytes = math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    for device in sharding.device_set:
      per[device] = per.get(device, 0) + nbytes
  return max(per.values()) / GIB if per else 0.0


def abstract_state(cfg, params, optimizer, key, lora_rank: int, base_dtype: str):
  """The abstract train state at step 0 (KL reference on, no critic): full fine-tuning, or
  with lora_rank > 0 adapters on every projection over a frozen base cast to base_dtype."""
  import jax
  from grpo_jax.models import lora
  from grpo_jax.train.learner.state import create_train_state

  def make(p, k):
    if not lora_rank:
      return create_train_state(p, optimizer, k, kl_coef=0.001)
    base = jax.tree.map(lambda x: x.astype(base_dtype), p)
    adapters = lora.init_adapters(base, lora.TARGETS, lora_rank, k)
    return create_train_state(adapters, optimizer, k, kl_coef=0.001, base_params=base)
  return jax.eval_shape(make, params, key)


def tree_shardings(tree, mesh):
  """The mesh rules' shardings of a params-like tree, in this grpo_jax version's API (the
  declared axes, or the path regexes of versions before them)."""
  try:
    from grpo_jax.models.partitioning import shardings
  except ImportError:  # grpo_jax before the declared logical axes
    from grpo_jax.parallel.mesh import tree_shardings as shardings
  return shardings(tree, mesh)


def state_bytes(state, mesh) -> dict:
  """GiB of the state and of its parts, on the most loaded device when there is a mesh."""
  size = (tree_gib if mesh is None else
          lambda t: per_device_gib(t, tree_shardings(t, mesh)))
  parts = {f: size(getattr(state, f)) for f in ("params", "opt_state", "ref_params",
                                                 "base_params")}
  return {"total": round(size(state), 4), **{k: round(v, 4) for k, v in parts.items()}}


def measure_state(args, cfg, params, key, mesh, base: dict) -> dict:
  """scale.py --what state: prints a line and a JSON line, returns the JSON's dict."""
  from grpo_jax.train.learner.state import make_optimizer
  optimizer = make_optimizer(optim_section(), 100)
  rank = args.lora_rank or 16
  full = state_bytes(abstract_state(cfg, params, optimizer, key, 0, "float32"), mesh)
  low = state_bytes(abstract_state(cfg, params, optimizer, key, rank, args.base_dtype), mesh)
  result = dict(what="state", **base, lora_rank=rank, base_dtype=args.base_dtype,
                per_device=mesh is not None, full_gib=full, lora_gib=low,
                lora_over_full=round(low["total"] / full["total"], 4))
  print(f"state {args.shape} mesh={'x'.join(map(str, args.mesh or ())) or 'none'}: full "
        f"fine-tuning {full['total']} GiB, LoRA r={rank} (base {args.base_dtype}) "
        f"{low['total']} GiB{' per device' if mesh is not None else ''}, ratio "
        f"{result['lora_over_full']}", flush=True)
  print(json.dumps(result), flush=True)
  return result


def optim_section():
  """The GSM8K recipe's optim section."""
  from configs import grpo_gsm8k
  return grpo_gsm8k.get_config().optim
