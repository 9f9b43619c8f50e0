"""Per-device bytes of params + optimizer state (+ reference) for a ~100M-parameter Qwen2-shaped
model under the mesh rules, for several (data, fsdp, tensor) meshes of 8 devices. Computed from
the shardings' shard shapes (nothing is allocated).

    python benchmarks/memory_table.py
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from grpo_jax.models.config import ModelConfig  # noqa: E402
from grpo_jax.models.decoder import init_params  # noqa: E402
from grpo_jax.models.partitioning import shardings as tree_shardings  # noqa: E402
from grpo_jax.parallel.mesh import make_mesh, mesh_config  # noqa: E402
from grpo_jax.train.learner.state import create_train_state, make_optimizer  # noqa: E402

CFG = ModelConfig(vocab_size=32_000, hidden_size=768, intermediate_size=2048, num_layers=12,
                  num_heads=12, num_kv_heads=4, head_dim=64, tie_embeddings=True, qkv_bias=True)
OPTIM = ml_collections.ConfigDict(dict(learning_rate=1e-6, warmup_steps=1, weight_decay=0.0,
                                       b1=0.9, b2=0.999, max_grad_norm=1.0))


def per_device_bytes(tree, shardings) -> int:
  total = 0
  for leaf, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    total += int(np.prod(sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize
  return total


def main():
  optimizer = make_optimizer(OPTIM, 10)
  state = jax.eval_shape(lambda k: create_train_state(init_params(CFG, k), optimizer, k,
                                                     kl_coef=0.001), jax.random.key(0))
  n = sum(x.size for x in jax.tree.leaves(state.params))
  print(f"model: {n / 1e6:.1f}M parameters (fp32), AdamW; 8 CPU devices")
  print("| mesh (data, fsdp, tensor) | params MiB/device | optimizer MiB/device | "
        "reference MiB/device | total MiB/device |")
  print("|---|---|---|---|---|")
  for shape in [(8, 1, 1), (4, 2, 1), (2, 4, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]:
    mesh = make_mesh(mesh_config(*shape))
    shardings = tree_shardings(state, mesh)
    parts = [per_device_bytes(getattr(state, f), getattr(shardings, f)) / 2**20
             for f in ("params", "opt_state", "ref_params")]
    print(f"| {shape} | {parts[0]:.1f} | {parts[1]:.1f} | {parts[2]:.1f} | {sum(parts):.1f} |")


if __name__ == "__main__":
  main()
