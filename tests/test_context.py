"""Context parallelism (mesh.context): each row's tokens split over devices give the loss, the
gradients and the per-token log-probs of one device, for GRPO, PPO with a value head, DPO,
packed rows and chunked log-probs, on 8 CPU devices in float32 (tests/context_worker.py)."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.attention import (attention_mask, grouped_query_attention,
                                       split_sequence_attention)

from tests.fixtures import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = ("context=4", "(fsdp, tensor, context)=(2, 2, 2)")


@pytest.fixture(scope="module")
def context_results():
  out = subprocess.run([sys.executable, "tests/context_worker.py"], cwd=ROOT,
                       env=xla_env(8, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["grpo", "ppo_value_head", "packed", "chunked", "dpo"])
def test_split_rows_equal_one_device(context_results, objective):
  r = context_results[objective]
  assert r["grad_norm"] > 0.5  # gradients that are not trivially zero
  for mesh in MESHES:
    for what in ("loss", "grads", "logprobs", "values"):
      assert r[mesh][what] <= 1e-5, (mesh, what, r[mesh][what])


def test_split_rows_hold_less_per_device(context_results):
  """A 2,048-token row's teacher-forced pass: its temporary bytes per device with the tokens
  over 4 devices are well under one device's (measured 27.8 MB against 109.0 MB, with the
  suite's XLA flags)."""
  temp = context_results["temp_bytes"]
  assert temp["context=4"] < 0.5 * temp["one_device"]


def test_sampler_splits_rows_over_context(context_results):
  """The sampler's programs take distinct rows on the context devices (16 rows over
  data x context = 2 x 4: 2 per device) and draw the tokens of one device."""
  r = context_results["sampler"]
  assert r["tokens_equal"]
  assert (r["rows"], r["rows_per_device"]) == (16, 2)


def test_split_attention_blocks_equal_one_pass():
  """split_sequence_attention's query blocks (here 3 queries each, off the mesh) give
  grouped_query_attention's output and gradients."""
  q = jax.random.normal(jax.random.key(0), (2, 10, 4, 8))
  k, v = (jax.random.normal(jax.random.key(i), (2, 2, 10, 8)) for i in (1, 2))
  mask = attention_mask(jnp.arange(10)[None] >= jnp.array([[0], [3]]), 10, 0)
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v, mask)))  # noqa: E731
  blocked = functools.partial(split_sequence_attention, block=3)
  want = jax.value_and_grad(loss(grouped_query_attention), argnums=(0, 1, 2))(q, k, v)
  got = jax.value_and_grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_allclose(blocked(q, k, v, mask), grouped_query_attention(q, k, v, mask),
                             atol=1e-6)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=1e-5)
