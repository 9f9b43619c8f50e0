"""Helpers the tests share by import (conftest.py keeps the pytest fixtures): a tiny model
config, params with every weight perturbed, configs/grpo_tiny.py shrunk to seconds, and the
logits of a transformers model and of our decoder on the same left-padded batch."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import Decoder, init_params, positions_from_mask
from grpo_jax.models.layout import stack_layers, unstack_layers


# The XLA flags the test session compiles with (tests/conftest.py adds them to $XLA_FLAGS before
# the workers start; tests/README.md): LLVM at -O0 and XLA:CPU's older elemental emitters for
# fusions. The same programs, compiled in about a quarter of the time (backend compile of
# tests/test_update.py's micro-batch tests: 40.8 s -> 9.8 s); a test's numbers are those of the
# same flags everywhere, its processes included. $GRPO_JAX_TEST_XLA_FLAGS replaces them ("" for
# XLA's defaults, as a user's run compiles).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_env(devices: int | None = None, **extra) -> dict:
  """The environment for a process a test starts: os.environ (the session's XLA flags in it)
  with `devices` fake CPU devices added to $XLA_FLAGS, and `extra` variables."""
  env = {**os.environ, **extra}
  if devices is not None:
    env["XLA_FLAGS"] = " ".join(
        [*env.get("XLA_FLAGS", "").split(), f"--xla_force_host_platform_device_count={devices}"])
  return env


def tiny_model_config(**overrides) -> ModelConfig:
  base = dict(vocab_size=19, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=8)
  base.update(overrides)
  return ModelConfig(**base)


def perturbed_params(cfg, seed=0):
  """Random params with non-trivial norm weights and biases, so every parameter matters. The
  noise is drawn per layer and stacked, so the tests keep the instances (and the measured
  margins of their tolerances) they had when params could also be laid out per layer."""
  params = unstack_layers(init_params(cfg, jax.random.key(seed)), cfg.num_layers)
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  leaves = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return stack_layers(jax.tree.unflatten(treedef, leaves), cfg.num_layers)


def with_fields(config, fields: dict):
  """config with each dotted field of `fields` ("warmup.steps": 5) set, new keys allowed;
  returns it."""
  with config.unlocked():
    for key, value in fields.items():
      node = config
      *parents, leaf = key.split(".")
      for p in parents:
        node = node[p]
      node[leaf] = value
  return config


def small_tiny_config(steps: int = 4, eval_every: int = 2, num_minibatches: int = 2):
  """configs/grpo_tiny.py shrunk to seconds: 5 warm-up steps, 4 prompts x 4 completions, a
  20-problem evaluation, and a first optimizer step of lr 0 followed by full-rate ones (two
  minibatches), so that every step really moves the params."""
  from configs import grpo_tiny  # noqa: PLC0415
  c = grpo_tiny.get_config()
  c.warmup.steps = 5
  c.warmup.batch_size = 32
  c.train.steps = steps
  c.train.eval_every = eval_every
  c.train.eval_size = 20
  c.train.eval_batch_size = 10
  c.rollout.num_prompts = 4
  c.rollout.group_size = 4
  c.rl.num_minibatches = num_minibatches
  c.optim.warmup_steps = 1
  return c


def transformers_logits(model, tokens, mask):
  """A transformers causal LM's float32 logits on a left-padded batch (positions count the
  real tokens, as our decoder's do)."""
  import torch  # noqa: PLC0415  (the tests that use it need the test extra)
  mask_t = torch.tensor(np.asarray(mask).astype(np.int64))
  with torch.no_grad():
    out = model(input_ids=torch.tensor(np.asarray(tokens).astype(np.int64)), attention_mask=mask_t,
                position_ids=(mask_t.cumsum(-1) - 1).clamp(min=0))
  return out.logits.float().numpy()


def decoder_logits(model_cfg, params, tokens, mask):
  """Our decoder's logits on the same left-padded batch."""
  mask = jnp.asarray(mask)
  logits, _ = Decoder(model_cfg).apply({"params": params}, jnp.asarray(tokens, jnp.int32),
                                       positions_from_mask(mask), mask)
  return np.asarray(logits)
