import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.decoder import Decoder, positions_from_mask
from grpo_jax.models.kv_cache import init_cache
from tests import numpy_reference
from tests.fixtures import perturbed_params, tiny_model_config

TOKENS = np.array([[0, 0, 3, 7, 9, 4, 11], [5, 6, 7, 8, 9, 10, 12]], np.int32)
MASK = TOKENS != 0


def _full_forward(params, cfg, tokens, mask):
  logits, _ = Decoder(cfg).apply({"params": params}, jnp.asarray(tokens),
                                 positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
  return np.asarray(logits)


@pytest.mark.parametrize("overrides", [
    dict(),  # GQA 4 heads / 2 kv heads, tied embeddings
    dict(num_kv_heads=4, tie_embeddings=False),  # multi-head attention, untied head
    dict(num_kv_heads=1, qkv_bias=True),  # Qwen2-style biases, multi-query attention
    dict(qk_norm=True, rope_theta=1_000_000.0),  # Qwen3-style q/k norm
])
def test_decoder_matches_numpy_reference(overrides):
  cfg = tiny_model_config(**overrides)
  params = perturbed_params(cfg)
  ours = _full_forward(params, cfg, TOKENS, MASK)
  for row in range(len(TOKENS)):
    ref = numpy_reference.forward(jax.device_get(params), cfg, TOKENS[row], MASK[row])
    real = MASK[row]
    np.testing.assert_allclose(ours[row][real], ref[real], atol=2e-5, rtol=1e-5)


def test_left_padding_does_not_change_logits(tiny_cfg):
  params = perturbed_params(tiny_cfg)
  padded = _full_forward(params, tiny_cfg, TOKENS[:1], MASK[:1])[0, 2:]
  unpadded = _full_forward(params, tiny_cfg, TOKENS[:1, 2:], MASK[:1, 2:])[0]
  np.testing.assert_allclose(padded, unpadded, atol=1e-5)


def test_prefill_then_cached_decode_equals_full_forward(tiny_cfg):
  params = perturbed_params(tiny_cfg)
  full = _full_forward(params, tiny_cfg, TOKENS, MASK)
  prompt_len, total = 4, TOKENS.shape[1]
  model = Decoder(tiny_cfg)
  kv_mask = jnp.asarray(MASK)
  positions = positions_from_mask(kv_mask)
  cache = init_cache(tiny_cfg, 2, total)
  logits, cache = model.apply({"params": params}, TOKENS[:, :prompt_len],
                              positions[:, :prompt_len], kv_mask, cache, 0)
  np.testing.assert_allclose(np.asarray(logits)[MASK[:, :prompt_len]],
                             full[:, :prompt_len][MASK[:, :prompt_len]], atol=1e-5)
  for t in range(prompt_len, total):
    logits, cache = model.apply({"params": params}, TOKENS[:, t:t + 1], positions[:, t:t + 1],
                                kv_mask, cache, t)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=1e-5)


def test_logits_window_equals_the_slice_of_all_logits(tiny_cfg):
  params = perturbed_params(tiny_cfg)
  full = _full_forward(params, tiny_cfg, TOKENS, MASK)
  mask = jnp.asarray(MASK)
  logits, _, hidden = Decoder(tiny_cfg).apply(
      {"params": params}, jnp.asarray(TOKENS), positions_from_mask(mask), mask,
      return_hidden=True, logits_window=(3, 2))
  assert logits.shape == (2, 2, tiny_cfg.vocab_size) and hidden.shape[:2] == (2, 2)
  np.testing.assert_allclose(np.asarray(logits), full[:, 3:5], atol=1e-6)
