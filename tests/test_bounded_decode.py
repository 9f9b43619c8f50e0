"""Bounded cache reads (attention.bounded_attention): a decode step that reads only the cache
blocks below a traced bound, with the softmax taken online, equals the one-pass attention over
every slot; the static engine's one decode loop (rollout.decode_loop="bounded") draws the same
tokens as its segments, and the slot-refill engine (which reads below its furthest busy slot)
the same as the static engine, with any slot count up to the rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.attention import (attention_mask, bounded_attention,
                                       grouped_query_attention, shared_prompt_attention)
from grpo_jax.rollout.sampler import generate
from tests.fixtures import perturbed_params
from tests.test_sampler_prefix import GROUP, NEW, PROMPT_MASK, PROMPTS, _assert_same, _sample


@pytest.mark.parametrize("block", [3, 4, 16, 64])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_bounded_attention_equals_one_pass_attention(block, softcap):
  rng = np.random.default_rng(0)
  batch, heads, kv_heads, dim, slots = 3, 4, 2, 8, 13
  q = jnp.asarray(rng.standard_normal((batch, 1, heads, dim)), jnp.float32)
  kt = jnp.asarray(rng.standard_normal((batch, kv_heads, dim, slots)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((batch, kv_heads, slots, dim)), jnp.float32)
  filled = np.array([2, 7, 11])  # each row's current slot: slots above it are unread
  kv_mask = jnp.asarray(rng.random((batch, slots)) > 0.2).at[:, 0].set(True)
  mask = attention_mask(kv_mask, 1, jnp.asarray(filled))
  want = grouped_query_attention(q, kt, v, mask, keys_transposed=True, softcap=softcap)
  got = jax.jit(bounded_attention, static_argnames=("block", "softcap"))(
      q, kt, v, mask, int(filled.max()) + 1, block=block, softcap=softcap)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=2e-6)


def test_bounded_shared_prompt_attention_equals_the_one_pass_form():
  rng = np.random.default_rng(1)
  prompts, group, heads, kv_heads, dim, plen, own = 2, 3, 4, 2, 8, 5, 9
  batch = prompts * group
  q = jnp.asarray(rng.standard_normal((batch, 1, heads, dim)), jnp.float32)
  arrays = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in
            [(prompts, kv_heads, dim, plen), (prompts, kv_heads, plen, dim),
             (batch, kv_heads, dim, own), (batch, kv_heads, own, dim)]]
  prompt_mask = jnp.asarray([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
  mask = attention_mask(jnp.ones((batch, own), bool), 1, 4)
  want = shared_prompt_attention(q, *arrays, prompt_mask, mask)
  got = shared_prompt_attention(q, *arrays, prompt_mask, mask, read_limit=jnp.int32(5))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("group", [1, GROUP])
@pytest.mark.parametrize("policy", [dict(temperature=0.0), dict(temperature=1.0)])
def test_one_bounded_decode_loop_draws_what_the_segments_draw(tiny_cfg, group, policy):
  params = perturbed_params(tiny_cfg, seed=3)
  tokens, mask = ((PROMPTS, PROMPT_MASK) if group > 1 else
                  (np.repeat(PROMPTS, GROUP, 0), np.repeat(PROMPT_MASK, GROUP, 0)))
  segments = _sample(tiny_cfg, params, tokens, mask, group, 4, **policy)
  bounded = _sample(tiny_cfg, params, tokens, mask, group, 4, decode_loop="bounded", **policy)
  _assert_same(bounded, segments)


@pytest.mark.parametrize("slots", [3, 12, 40])  # 12 rows: fewer slots, as many, more (clamped)
def test_refill_with_bounded_reads_draws_what_the_static_engine_draws(tiny_cfg, slots):
  params = perturbed_params(tiny_cfg, seed=3)
  static = _sample(tiny_cfg, params, PROMPTS, PROMPT_MASK, GROUP, 4, temperature=1.0)
  refill = _sample(tiny_cfg, params, PROMPTS, PROMPT_MASK, GROUP, 4, temperature=1.0,
                   decode_slots=slots)
  _assert_same(refill, static)
