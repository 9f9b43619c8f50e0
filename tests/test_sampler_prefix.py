"""Prefix sharing and decode segments change no drawn token: the sampler with G rows per
prompt (each prompt prefilled once, its cache held once and read once per decode step for its G
rows: attention.shared_prompt_attention) and with decode in segments that read only the filled
cache equals the sampler fed every prompt G times that reads all P + N slots every step: the
same tokens and masks; log-probs within 1e-5 (a matmul over 3 rows or 12, and a softmax over
fewer masked slots, may round the last bits differently)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.attention import grouped_query_attention, shared_prompt_attention
from grpo_jax.rollout.sampler import generate
from grpo_jax.rollout.static import decode_segments
from tests.fixtures import perturbed_params

EOS, PAD = 2, 0
PROMPTS = np.array([[0, 0, 3, 7, 9], [5, 6, 7, 8, 9], [0, 0, 0, 1, 4]], np.int32)
PROMPT_MASK = PROMPTS != 0
GROUP, NEW = 4, 11


def _sample(cfg, params, tokens, mask, group_size, decode_block, **policy):
  return generate(params, tokens, mask, jax.random.key(7), model_cfg=cfg, max_new_tokens=NEW,
                  eos_id=EOS, pad_id=PAD, group_size=group_size, decode_block=decode_block,
                  **policy)


def _assert_same(got, want):
  for name in ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask",
               "truncated"):
    np.testing.assert_array_equal(np.asarray(getattr(got, name)),
                                  np.asarray(getattr(want, name)), err_msg=name)
  np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=1e-5)


def test_decode_segments_cover_every_decode_step():
  assert decode_segments(11, 0) == [10]
  assert decode_segments(11, 4) == [4, 8, 10]
  assert decode_segments(11, 5) == [5, 10]
  assert decode_segments(11, 64) == [10]
  assert decode_segments(1, 4) == [0]


@pytest.mark.parametrize("policy", [dict(temperature=0.0),
                                    dict(temperature=1.0),
                                    dict(temperature=0.8, top_k=6, top_p=0.9)])
def test_shared_prefix_and_segments_equal_repeated_prompts(tiny_cfg, policy):
  cfg = tiny_cfg
  params = perturbed_params(tiny_cfg, seed=3)
  repeated = np.repeat(PROMPTS, GROUP, 0), np.repeat(PROMPT_MASK, GROUP, 0)
  today = _sample(cfg, params, *repeated, 1, 0, **policy)
  assert 10 < int(np.asarray(today.completion_mask).sum()) < len(repeated[0]) * NEW
  for block in (0, 1, 4, 64):
    _assert_same(_sample(cfg, params, PROMPTS, PROMPT_MASK, GROUP, block, **policy), today)


@pytest.mark.parametrize("queries", [1, 3])
def test_shared_prompt_attention_equals_attention_over_the_repeated_cache(queries):
  """3 prompts x G = 4 rows, 6 query heads on 2 kv heads: the prompts' keys and values held once
  give what every row's own copy of them gives (grouped_query_attention on the concatenated,
  repeated cache), masked prompt and own slots included."""
  prompts, group, heads, kv_heads, dim, prompt_len, own = 3, 4, 6, 2, 8, 5, 7
  rows = prompts * group
  keys = jax.random.split(jax.random.key(0), 7)
  q = jax.random.normal(keys[0], (rows, queries, heads, dim))
  prompt_kt = jax.random.normal(keys[1], (prompts, kv_heads, dim, prompt_len))
  prompt_v = jax.random.normal(keys[2], (prompts, kv_heads, prompt_len, dim))
  kt = jax.random.normal(keys[3], (rows, kv_heads, dim, own))
  v = jax.random.normal(keys[4], (rows, kv_heads, own, dim))
  prompt_mask = jax.random.uniform(keys[5], (prompts, prompt_len)) > 0.3
  mask = jax.random.uniform(keys[6], (rows, queries, own)) > 0.4
  got = shared_prompt_attention(q, prompt_kt, prompt_v, kt, v, prompt_mask, mask)
  repeat = lambda x: jnp.repeat(x, group, axis=0)  # noqa: E731
  full_mask = jnp.concatenate(
      [jnp.broadcast_to(repeat(prompt_mask)[:, None], (rows, queries, prompt_len)), mask], -1)
  want = grouped_query_attention(q, jnp.concatenate([repeat(prompt_kt), kt], -1),
                                 jnp.concatenate([repeat(prompt_v), v], 2), full_mask,
                                 keys_transposed=True)
  assert not np.asarray(prompt_mask).all() and not np.asarray(mask).all()
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
