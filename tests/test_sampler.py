import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.decoder import Decoder, positions_from_mask
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rollout.sampler import generate
from grpo_jax.rollout.sampling import (choose_tokens, first_argmax, inverse_cdf_sample,
                                       top_k_filter, top_p_filter)
from tests.fixtures import perturbed_params

EOS, PAD = 2, 0
PROMPTS = np.array([[0, 0, 3, 7, 9], [5, 6, 7, 8, 9], [0, 0, 0, 1, 4]], np.int32)
PROMPT_MASK = PROMPTS != 0


def test_greedy_equals_stepwise_argmax_of_full_forward(tiny_cfg):
  params = perturbed_params(tiny_cfg)
  steps = 6
  out = generate(params, PROMPTS, PROMPT_MASK, jax.random.key(0), model_cfg=tiny_cfg,
                 max_new_tokens=steps, temperature=0.0, eos_id=EOS, pad_id=PAD)
  model = Decoder(tiny_cfg)
  for row in range(len(PROMPTS)):
    seq = [int(t) for t, m in zip(PROMPTS[row], PROMPT_MASK[row]) if m]  # no padding at all
    expected = []
    for _ in range(steps):
      tokens = jnp.asarray([seq])
      mask = jnp.ones_like(tokens, bool)
      logits, _ = model.apply({"params": params}, tokens, positions_from_mask(mask), mask)
      nxt = int(np.argmax(np.asarray(logits)[0, -1]))
      expected.append(nxt)
      seq.append(nxt)
      if nxt == EOS:
        break
    got = np.asarray(out.completion_tokens[row])
    n = len(expected)
    assert got[:n].tolist() == expected
    assert np.all(got[n:] == PAD)
    assert np.asarray(out.completion_mask[row]).tolist() == [True] * n + [False] * (steps - n)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0),
                                                     (1.3, 0, 0.8)])
def test_sampler_logprobs_equal_full_forward_recomputation(tiny_cfg, temperature, top_k,
                                                           top_p):
  params = perturbed_params(tiny_cfg, seed=3)
  rep = np.repeat(PROMPTS, 4, 0), np.repeat(PROMPT_MASK, 4, 0)
  out = generate(params, *rep, jax.random.key(7), model_cfg=tiny_cfg, max_new_tokens=8,
                 temperature=temperature, top_k=top_k, top_p=top_p, eos_id=EOS, pad_id=PAD)
  assert np.asarray(out.completion_mask).sum() > 20  # something was actually sampled
  recomputed, _ = completion_logprobs(params, tiny_cfg, out.prompt_tokens, out.prompt_mask,
                                      out.completion_tokens, out.completion_mask, temperature)
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(recomputed), atol=1e-5)


def test_eos_ends_each_row_and_masks_follow(tiny_cfg):
  params = perturbed_params(tiny_cfg, seed=5)
  # Make <eos> likely so some rows stop early and others not.
  params["embed_tokens"]["embedding"] = params["embed_tokens"]["embedding"].at[EOS].multiply(3.0)
  rep = np.repeat(PROMPTS, 8, 0), np.repeat(PROMPT_MASK, 8, 0)
  out = generate(params, *rep, jax.random.key(1), model_cfg=tiny_cfg, max_new_tokens=6,
                 temperature=1.0, eos_id=EOS, pad_id=PAD)
  tokens, mask = np.asarray(out.completion_tokens), np.asarray(out.completion_mask)
  lengths = mask.sum(1)
  assert 0 < np.sum(out.truncated) < len(tokens)  # both kinds of row occur
  for row in range(len(tokens)):
    eos_at = np.flatnonzero(tokens[row] == EOS)
    if out.truncated[row]:
      assert eos_at.size == 0 and lengths[row] == 6
    else:
      assert lengths[row] == eos_at[0] + 1  # mask covers up to and including <eos>
    assert np.all(tokens[row][lengths[row]:] == PAD)
    assert np.all(np.asarray(out.logprobs)[row][lengths[row]:] == 0.0)
    assert mask[row].tolist() == [True] * lengths[row] + [False] * (6 - lengths[row])


def _np_top_k(logits, k):
  out = np.full_like(logits, -1e30)
  for r, row in enumerate(logits):
    kth = np.sort(row)[::-1][k - 1]
    out[r] = np.where(row >= kth, row, -1e30)
  return out


def _np_top_p(logits, p):
  out = np.full_like(logits, -1e30)
  for r, row in enumerate(logits):
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    mass = 0.0
    for i in np.argsort(-row, kind="stable"):
      if mass < p:
        out[r, i] = row[i]
      mass += probs[i]
  return out


def test_top_k_and_top_p_filters_match_numpy():
  logits = np.asarray(jax.random.normal(jax.random.key(0), (5, 11)), np.float32) * 2
  for k in (1, 3, 10):
    np.testing.assert_array_equal(np.asarray(top_k_filter(jnp.asarray(logits), k)),
                                  _np_top_k(logits, k))
  for p in (0.05, 0.5, 0.9):
    np.testing.assert_array_equal(np.asarray(top_p_filter(jnp.asarray(logits), p)),
                                  _np_top_p(logits, p))


def test_top_k_one_sampling_is_greedy(tiny_cfg):
  params = perturbed_params(tiny_cfg)
  kw = dict(model_cfg=tiny_cfg, max_new_tokens=5, eos_id=EOS, pad_id=PAD)
  greedy = generate(params, PROMPTS, PROMPT_MASK, jax.random.key(0), temperature=0.0, **kw)
  top1 = generate(params, PROMPTS, PROMPT_MASK, jax.random.key(9), temperature=1.0, top_k=1,
                  **kw)
  np.testing.assert_array_equal(greedy.completion_tokens, top1.completion_tokens)


def test_first_argmax_equals_jax_argmax_and_greedy_choice_matches():
  logits = jax.random.normal(jax.random.key(3), (16, 50)) * 3
  ties = jnp.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
  for x in (logits, ties):
    np.testing.assert_array_equal(first_argmax(x), jnp.argmax(x, axis=-1))
    tokens, logp, _ = choose_tokens(x, None, 0.0, 0, 1.0)
    np.testing.assert_array_equal(tokens, jnp.argmax(x, axis=-1))
    ref = np.asarray(jax.nn.log_softmax(x, axis=-1))[np.arange(len(x)), np.argmax(x, axis=-1)]
    np.testing.assert_allclose(logp, ref, rtol=0, atol=1e-6)


def _np_inverse_cdf(weights, uniform):
  """Reference: first index whose float64 cumulative weight exceeds uniform * total."""
  cdf = np.cumsum(np.asarray(weights, np.float64), axis=-1)
  return np.array([np.searchsorted(c, u * c[-1], side="right") for c, u in zip(cdf, uniform)])


@pytest.mark.parametrize("vocab", [50, 128, 300])
def test_inverse_cdf_sample_matches_numpy_searchsorted(vocab):
  weights = np.exp(np.random.default_rng(vocab).normal(size=(64, vocab)) * 2).astype(np.float32)
  weights[:, ::7] = 0.0  # zero-weight tokens
  uniform = np.random.default_rng(1).uniform(size=64).astype(np.float32)
  got = np.asarray(inverse_cdf_sample(jnp.asarray(weights), jnp.asarray(uniform)))
  np.testing.assert_array_equal(got, _np_inverse_cdf(weights, uniform))
  assert np.all(weights[np.arange(64), got] > 0)


def test_inverse_cdf_sample_never_draws_zero_weight_tokens_at_the_ends():
  weights = np.zeros((4, 300), np.float32)
  weights[0, 5] = 1.0  # one token
  weights[1, [0, 299]] = [1e-30, 1.0]  # last token, tiny first one
  weights[2, 130:140] = 1.0  # one block only, others empty
  weights[3, [3, 200]] = [1.0, 1e-30]  # mass at the start, a tiny last positive token
  largest_below_one = np.float32(1.0) - np.float32(2.0 ** -24)
  for u in (0.0, 0.5, largest_below_one):
    got = np.asarray(inverse_cdf_sample(jnp.asarray(weights), jnp.full((4,), u, jnp.float32)))
    assert np.all(weights[np.arange(4), got] > 0), (u, got)
    assert got[0] == 5 and 130 <= got[2] < 140


def test_sampled_token_frequencies_follow_the_softmax():
  """400k draws from one row of 40 logits (T = 0.7, and with top-k 5): every token's
  frequency within 5 standard errors of softmax(logits / T) (renormalised over the top 5)."""
  logits = jax.random.normal(jax.random.key(7), (1, 40)) * 2
  draws = 400_000
  keys = jax.random.split(jax.random.key(0), draws // 1000)
  for top_k in (0, 5):
    def chunk(key, top_k=top_k):
      rows = jnp.broadcast_to(logits, (1000, 40))
      return choose_tokens(rows, jax.random.uniform(key, (1000,)), 0.7, top_k, 1.0)[0]
    tokens = np.asarray(jax.jit(jax.vmap(chunk))(keys)).ravel()
    probs = np.asarray(jax.nn.softmax(logits[0] / 0.7), np.float64)
    if top_k:
      probs = np.where(probs >= np.sort(probs)[-top_k], probs, 0.0)
      probs /= probs.sum()
    freq = np.bincount(tokens, minlength=40) / draws
    err = np.sqrt(probs * (1 - probs) / draws)
    z = np.abs(freq - probs) / np.maximum(err, 1e-12)
    assert np.all(z <= 5), z.max()


def test_a_nonpositive_top_p_keeps_the_most_likely_token_and_settings_are_checked(tiny_cfg):
  """top_p <= 0 kept no token of the sorted order, so the cutoff fell to the least likely one
  and every token was kept (the full distribution, the opposite of asking for few); a direct
  sampler call with impossible settings died in an IndexError or a ZeroDivisionError."""
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from grpo_jax.rollout.sampler import Sampling  # noqa: PLC0415
  logits = jax.random.normal(jax.random.key(0), (5, 11)) * 2
  kept = np.asarray(top_p_filter(logits, 0.0)) > -1e30
  np.testing.assert_array_equal(kept.sum(-1), 1)
  np.testing.assert_array_equal(kept.argmax(-1), np.asarray(logits).argmax(-1))
  for field, value in (("max_new_tokens", 0), ("top_p", 0.0), ("temperature", -1.0)):
    settings = {**dict(max_new_tokens=4, eos_id=2, pad_id=0), field: value}
    with pytest.raises(ConfigError, match=f"sampling {field}={value}; use"):
      Sampling(tiny_cfg, **settings)
  with pytest.raises(ConfigError, match="sampling group_size=0"):
    Sampling(tiny_cfg, 4, 2, 0).grouped(0)
  # A misspelt decode loop ran "segments", a weight dtype failed later in a ValueError.
  with pytest.raises(ConfigError, match="sampling decode_loop='Bounded'; use 'auto', "
                                        "'segments' or 'bounded'."):
    Sampling(tiny_cfg, 4, 2, 0, decode_loop="Bounded")
  with pytest.raises(ConfigError, match=r"sampling weight_dtype='int4'; use '' \(the params"):
    Sampling(tiny_cfg, 4, 2, 0, weight_dtype="int4")
  # One row_id per prompt instead of per row: the refill engine's gather clamped it (rows
  # 1-7 drew row 1's tokens), a single prompt's broadcast (every row the same draws).
  from grpo_jax.models.decoder import init_params  # noqa: PLC0415
  params = init_params(tiny_cfg, jax.random.key(0))
  prompts, mask = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool)
  for slots in (0, 3):
    sampling = Sampling(tiny_cfg, 4, 2, 0, decode_slots=slots).grouped(4)
    with pytest.raises(ConfigError, match=r"^row_ids has shape \(2,\), the call samples 8 rows"):
      sampling.with_stats(params, prompts, mask, jax.random.key(1), row_ids=jnp.arange(2))
  with pytest.raises(ConfigError, match=r"^row_limits has shape \(1,\), the call samples 4 rows"):
    sampling.with_stats(params, prompts[:1], mask[:1], jax.random.key(1), row_limits=jnp.ones(1))


def test_raw_uint32_keys_draw_what_their_typed_keys_draw():
  """A batch of jax.random.PRNGKey-style keys (B, 2) uint32 was taken for one key (the KV
  continuation folds the turn into the key per row: fold_in raised)."""
  from grpo_jax.rollout.sampling import token_uniforms  # noqa: PLC0415
  raw = jax.vmap(lambda t: jax.random.fold_in(jax.random.PRNGKey(3), t))(jnp.arange(4))
  rows, steps = jnp.arange(4, dtype=jnp.int32), jnp.array([0, 1, 2, 3], jnp.int32)
  np.testing.assert_array_equal(token_uniforms(raw, rows, steps),
                                token_uniforms(jax.random.wrap_key_data(raw), rows, steps))
