"""Context parallelism (mesh.context): each row's tokens split over devices give the loss, the
gradients and the per-token log-probs of one device, for GRPO, PPO with a value head, DPO,
packed rows, chunked log-probs and the zig-zag layout, on 8 CPU devices in float32
(tests/context_worker.py); the TPU path's splash kernel over split rows, run by Pallas's
interpreter, gives one device's attention, and the RL step lowers for TPU with it."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.attention import attention_mask, grouped_query_attention
from grpo_jax.models.context import (from_layout, in_layout, layout_mask, layout_order,
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
@pytest.mark.parametrize("objective", ["grpo", "ppo_value_head", "packed", "chunked", "zigzag",
                                       "dpo"])
def test_split_rows_equal_one_device(context_results, objective):
  r = context_results[objective]
  assert r["grad_norm"] > 0.5  # gradients that are not trivially zero
  for mesh in MESHES:
    for what in ("loss", "grads", "logprobs", "values"):
      assert r[mesh][what] <= 1e-5, (mesh, what, r[mesh][what])


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_splash_kernel_over_split_rows_equals_one_device(context_results, layout):
  """jax's Pallas splash kernel (the TPU path, run by Pallas's interpreter on the CPU) on rows
  split over 4 devices, in the layout's order: the real queries' outputs and the gradients of
  one device's attention (measured: outputs 1.5e-6; gradients 7.6e-6 contiguous and 1.1e-5
  zig-zag, of gradients up to 14.0)."""
  r = context_results["splash"][layout]
  assert r["out"] <= 1e-5
  assert r["grads"] <= 4e-6 * r["grads_scale"]


def test_rl_step_lowers_for_tpu_with_split_rows(context_results):
  """GRPO's gradient on (data, context) = (2, 4), lowered for TPU with the TPU row of the
  table (the zig-zag layout, the Pallas kernels): its attention is the splash kernel's forward
  pass and its two backward passes (dq, dkv), one call each in the scanned layer. The
  sampler on the same mesh (prompts of 512 tokens): its prefill is the splash forward."""
  r = context_results["tpu_lowering"]
  assert r["custom_calls"] == 3
  for kernel in ("splash_mqa_fwd", "splash_mqa_dq", "splash_mqa_dkv"):
    assert any(name.startswith(kernel) for name in r["kernels"]), r["kernels"]
  # the sampler's prefill (its tokens split): the splash forward kernel, nothing else
  assert r["sampler_custom_calls"] == 1
  assert [n for n in r["sampler_kernels"] if n.startswith("splash_mqa")] == [
      "splash_mqa_fwd_segmented_no_residuals"], r["sampler_kernels"]


def test_split_rows_hold_less_per_device(context_results):
  """A 2,048-token row's teacher-forced pass: its temporary bytes per device with the tokens
  over 4 devices are well under one device's (measured 27.8 MB against 109.0 MB, with the
  suite's XLA flags)."""
  temp = context_results["temp_bytes"]
  assert temp["context=4"] < 0.5 * temp["one_device"]


def test_sampler_splits_rows_over_context(context_results):
  """The sampler's prefill splits each prompt's 4 tokens over context = 4 and its decode loop
  takes distinct rows on the context devices (16 rows over data x context = 2 x 4: 2 per
  device); it draws the tokens of one device."""
  r = context_results["sampler"]
  assert r["tokens_equal"]
  assert (r["rows"], r["rows_per_device"]) == (16, 2)


def test_splash_prefill_over_split_tokens_equals_one_device(context_results):
  """The sampler's prefill with its tokens over context = 4 and the TPU path's splash kernel
  (Pallas's interpreter) gives one device's XLA prefill: the last logits and the cache's real
  slots (measured 2.6e-6 and 7.6e-6)."""
  r = context_results["splash_prefill"]
  assert r["logits"] < 1e-5 and r["cache"] < 2e-5, r


def test_prefill_splits_one_long_prompt(context_results):
  """One 2,048-token prompt, which cannot split over rows: the sampler's prefill splits its
  tokens over context = 4 (mesh.prefill_rules). Its temporary bytes per device, measured
  19.4 MB against 269.5 MB on one device (and 269.4 MB per device when the prefill took rows
  only, every context device computing the whole prompt)."""
  temp = context_results["prefill_temp_bytes"]
  assert temp["context=4"] < 0.25 * temp["one_device"]


@pytest.mark.parametrize("length, context", [(16, 2), (24, 3), (64, 4)])
def test_zigzag_layout_is_the_order_and_its_inverse(length, context):
  """in_layout puts a token axis in layout_order's order (device c: chunks c and 2C - 1 - c,
  by slicing, not a gather), from_layout puts it back, and layout_mask is the slot-order mask
  with its queries and keys both in that order."""
  order = layout_order(length, context, "zigzag")
  chunk = length // (2 * context)
  assert list(order[chunk - 1:chunk + 1]) == [chunk - 1, length - chunk]
  x = np.random.default_rng(0).normal(size=(2, 3, length, 4)).astype(np.float32)
  np.testing.assert_array_equal(in_layout(jnp.asarray(x), order, 2), x[:, :, order])
  np.testing.assert_array_equal(from_layout(in_layout(jnp.asarray(x), order, -2), order, 2), x)
  kv_mask = jnp.arange(length)[None] >= jnp.array([[0], [5]])
  want = np.asarray(attention_mask(kv_mask, length, 0))[:, order][:, :, order]
  np.testing.assert_array_equal(layout_mask(kv_mask, order), want)


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
