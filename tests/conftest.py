import jax
import pytest

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import init_params


def tiny_model_config(**overrides) -> ModelConfig:
  base = dict(vocab_size=19, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=8)
  base.update(overrides)
  return ModelConfig(**base)


def perturbed_params(cfg, seed=0):
  """Random params with non-trivial norm weights and biases, so every parameter matters."""
  params = init_params(cfg, jax.random.key(seed))
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  leaves = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, leaves)


@pytest.fixture
def tiny_cfg():
  return tiny_model_config()
