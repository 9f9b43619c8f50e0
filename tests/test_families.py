"""A model family is one module: a toy family written outside the package
(tests/plugins/parallel_family.py: GPT-J / PaLM's parallel layer, a squared-ReLU MLP) is
registered through config.imports and then equals an independent NumPy forward, decodes from
the KV cache as it scores, round-trips through the Hugging Face edge under its own model_type,
and trains; an unknown family is one sentence. No file of grpo_jax/ names it."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ConfigError
from grpo_jax.models.decoder import Decoder, positions_from_mask
from grpo_jax.models.hf import load_hf_checkpoint
from grpo_jax.models.hf_export import export_hf_checkpoint
from grpo_jax.models.kv_cache import init_cache
from grpo_jax.registry import import_plugins
from grpo_jax.train.stages.rl import train
from tests import numpy_reference
from tests.fixtures import perturbed_params, small_tiny_config, tiny_model_config

PLUGIN = "tests/plugins/parallel_family.py"
TOKENS = np.array([[0, 0, 3, 7, 9, 4, 11], [5, 6, 7, 8, 9, 10, 12]], np.int32)
MASK = TOKENS != 0


@pytest.fixture(scope="module")
def cfg():
  import_plugins(PLUGIN, log=lambda *_: None)
  return tiny_model_config(family="parallel", tie_embeddings=False)


def _forward(params, cfg, tokens, mask):
  logits, _ = Decoder(cfg).apply({"params": params}, jnp.asarray(tokens),
                                 positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
  return np.asarray(logits)


def test_the_toy_family_equals_a_numpy_forward_of_its_definition(cfg):
  params = perturbed_params(cfg)
  assert set(params["layers"]) == {"input_layernorm", "self_attn", "mlp"}  # one norm a layer
  ours = _forward(params, cfg, TOKENS, MASK)
  relu_squared = lambda x: np.square(np.maximum(x, 0.0))  # noqa: E731
  for row in range(len(TOKENS)):
    ref = numpy_reference.forward(jax.device_get(params), cfg, TOKENS[row], MASK[row],
                                  parallel=True, activation=relu_squared)
    np.testing.assert_allclose(ours[row][MASK[row]], ref[MASK[row]], atol=2e-5, rtol=1e-5)
    # The MLP's activation is the family's: SwiGLU's on the same params is far off.
    silu = numpy_reference.forward(jax.device_get(params), cfg, TOKENS[row], MASK[row],
                                   parallel=True)
    assert np.abs(ours[row][MASK[row]] - silu[MASK[row]]).max() > 1e-2


def test_the_toy_family_decodes_from_its_cache_as_it_scores(cfg):
  params = perturbed_params(cfg)
  full = _forward(params, cfg, TOKENS, MASK)
  model, kv_mask = Decoder(cfg), jnp.asarray(MASK)
  positions = positions_from_mask(kv_mask)
  cache = init_cache(cfg, 2, TOKENS.shape[1])
  _, cache = model.apply({"params": params}, TOKENS[:, :4], positions[:, :4], kv_mask, cache, 0)
  for t in range(4, TOKENS.shape[1]):
    logits, cache = model.apply({"params": params}, TOKENS[:, t:t + 1], positions[:, t:t + 1],
                                kv_mask, cache, t)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=1e-5)


def test_the_toy_family_round_trips_through_the_hugging_face_edge(cfg, tmp_path):
  params = perturbed_params(cfg)
  export_hf_checkpoint(params, cfg, tmp_path, model_type=cfg.blocks.export_model_type(cfg))
  loaded_cfg, loaded = load_hf_checkpoint(tmp_path)
  assert loaded_cfg.family == "parallel"
  for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with pytest.raises(ValueError, match="model_type='llama' does not describe this model"):
    export_hf_checkpoint(params, cfg, tmp_path / "as_llama", model_type="llama")


def test_the_toy_family_trains_from_config_imports(tmp_path):
  config = small_tiny_config(steps=2, eval_every=2, num_minibatches=1)
  config.imports = PLUGIN
  config.model.family = "parallel"
  state = train(config, str(tmp_path), log=lambda *_: None)
  assert "post_attention_layernorm" not in state.train.params["layers"]
  assert int(state.step) == 2
  assert np.isfinite(np.asarray(state.train.params["layers"]["mlp"]["up_proj"]["kernel"])).all()
  package = pathlib.Path(__file__).parents[1] / "grpo_jax"
  assert not any("ParallelBlocks" in p.read_text() for p in package.rglob("*.py"))


def test_an_unknown_family_is_one_sentence(tmp_path):
  config = small_tiny_config(steps=1)
  config.model.family = "gpt_neox"
  with pytest.raises(ConfigError, match=r"model.family='gpt_neox' is unknown; valid: gemma, llama, .*qwen3_moe"):
    train(config, str(tmp_path), log=lambda *_: None)
