"""DeepSeek-V3.2's keep-sampling mask (rl.keep_sampling_mask): what the sampler records of each
token's top-k / top-p truncation (rollout/sampling.keep_record), the trainer's renormalised
log-probs (models/scoring.py) against NumPy, and both engines unchanged in what they draw."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import validate
from grpo_jax.defaults import get_defaults
from grpo_jax.errors import ConfigError
from grpo_jax.models.scoring import completion_logits, token_logprobs_and_entropy
from grpo_jax.rollout.sampler import generate
from grpo_jax.rollout.sampling import choose_tokens
from tests.fixtures import perturbed_params
from tests.test_sampler import _np_top_k, _np_top_p

EOS, PAD = 2, 0
PROMPTS = np.array([[0, 0, 3, 7, 9], [5, 6, 7, 8, 9], [0, 0, 0, 1, 4]], np.int32)


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.7), (8, 0.9), (40, 1.0)])
def test_recorded_set_and_mass_equal_numpy(top_k, top_p):
  """The set {v : log pi(v) >= cutoff} is exactly the one the NumPy filters keep, and
  kept_logmass is the log of its softmax mass (float64 reference)."""
  logits = np.asarray(jax.random.normal(jax.random.key(1), (6, 40)), np.float32) * 2.5
  temperature = 0.8
  scaled = logits / temperature
  kept_np = scaled.copy()
  if top_k:
    kept_np = _np_top_k(kept_np, top_k)
  kept_np = _np_top_p(kept_np, top_p) if top_p < 1 else kept_np
  kept_np = kept_np > -1e29
  uniform = jax.random.uniform(jax.random.key(2), (6,))
  tokens, logp, kept = choose_tokens(jnp.asarray(logits), uniform, temperature, top_k, top_p,
                                     keep=True)
  plain_tokens, plain_logp, none = choose_tokens(jnp.asarray(logits), uniform, temperature,
                                                 top_k, top_p)
  assert none is None
  np.testing.assert_array_equal(tokens, plain_tokens)  # recording changes nothing drawn
  np.testing.assert_array_equal(logp, plain_logp)
  if kept_np.all():  # top-k 40 of a 40-token vocabulary: no filter, nothing recorded
    assert kept is None
    return
  cutoff, logmass = (np.asarray(x) for x in kept)
  logp_all = _log_softmax(scaled)
  np.testing.assert_array_equal(logp_all >= cutoff[:, None], kept_np)
  want = np.log(np.where(kept_np, np.exp(logp_all), 0).sum(-1))
  np.testing.assert_allclose(logmass, want, atol=2e-6)
  assert kept_np[np.arange(6), np.asarray(tokens)].all()  # drawn from the kept set


def test_renormalised_logprobs_equal_numpy():
  logits = jax.random.normal(jax.random.key(3), (2, 3, 30)) * 2
  tokens = jax.random.randint(jax.random.key(4), (2, 3), 0, 30)
  logp_all = _log_softmax(np.asarray(logits))
  cutoff = np.sort(logp_all, -1)[..., -6] - 1e-3  # the 6 most likely tokens
  logp, entropy = token_logprobs_and_entropy(logits, tokens, 1.0, jnp.asarray(cutoff))
  plain_logp, plain_entropy = token_logprobs_and_entropy(logits, tokens, 1.0)
  t = np.asarray(tokens)
  chosen = np.take_along_axis(logp_all, t[..., None], -1)[..., 0]
  in_set = (logp_all >= cutoff[..., None]) | (np.arange(30) == t[..., None])  # the token too
  want = chosen - np.log(np.where(in_set, np.exp(logp_all), 0).sum(-1))
  np.testing.assert_allclose(logp, want, atol=1e-5)
  np.testing.assert_array_equal(entropy, plain_entropy)  # the entropy stays pi's
  assert np.all(np.asarray(logp) >= np.asarray(plain_logp) - 1e-6)


@pytest.mark.parametrize("decode_slots", [0, 2])
def test_sampler_records_the_truncation_and_draws_the_same_tokens(tiny_cfg, decode_slots):
  """Both engines: tokens and log-probs bit-identical with and without recording; the recorded
  mass equals the truncated softmax of a full forward pass; with top_p = 1 and top_k off
  nothing is recorded and the log-probs are today's."""
  params = perturbed_params(tiny_cfg)
  kw = dict(model_cfg=tiny_cfg, max_new_tokens=6, eos_id=EOS, pad_id=PAD, temperature=1.0,
            group_size=2, decode_slots=decode_slots)
  key = jax.random.key(7)
  mask = PROMPTS != 0
  plain = generate(params, PROMPTS, mask, key, top_p=0.8, **kw)
  kept = generate(params, PROMPTS, mask, key, top_p=0.8, keep_mask=True, **kw)
  np.testing.assert_array_equal(plain.completion_tokens, kept.completion_tokens)
  np.testing.assert_array_equal(plain.logprobs, kept.logprobs)
  assert plain.keep_cutoff is None and kept.keep_cutoff is not None
  logits = completion_logits(params, tiny_cfg, kept.prompt_tokens, kept.prompt_mask,
                             kept.completion_tokens, kept.completion_mask)
  logp_all = _log_softmax(np.asarray(logits))
  live = np.asarray(kept.completion_mask)
  in_set = logp_all >= np.asarray(kept.keep_cutoff)[..., None]
  want = np.log(np.where(in_set, np.exp(logp_all), 0).sum(-1))
  np.testing.assert_allclose(np.asarray(kept.kept_logmass)[live], want[live], atol=1e-5)
  assert np.all(np.asarray(kept.kept_logmass)[live] < 0)  # top-p 0.8 cut something
  off = generate(params, PROMPTS, mask, key, keep_mask=True, **kw)  # top_p 1, top_k 0
  today = generate(params, PROMPTS, mask, key, **kw)
  assert off.keep_cutoff is None and off.kept_logmass is None
  np.testing.assert_array_equal(off.logprobs, today.logprobs)
  np.testing.assert_array_equal(off.completion_tokens, today.completion_tokens)


def test_config_without_truncation_is_refused():
  c = get_defaults()
  c.rl.keep_sampling_mask = True
  with pytest.raises(ConfigError, match="no truncation to keep"):
    validate(c)
  c.rollout.top_p = 0.9
  validate(c)
