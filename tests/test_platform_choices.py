"""The platform table (parallel/choices.py) and what it switches: "auto" settings resolved per
platform, jax.nn.dot_product_attention (model.attention_impl="jax", the form whose "cudnn"
kernel a GPU runs) equal to our attention in the teacher-forced pass and the prefill, the
sampler's compute-dtype copy of the weights changing nothing, and no sort of the vocabulary
in a decode step unless top-k or top-p is on."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ConfigError, validate
from grpo_jax.defaults import get_defaults
from grpo_jax.models.decoder import decoder_apply, positions_from_mask
from grpo_jax.models.layout import compute_copy
from grpo_jax.parallel.choices import PLATFORM_TABLE, choose, table_lines
from grpo_jax.rollout.sampler import Sampling, _sample, generate
from tests.fixtures import perturbed_params
from tests.test_sampler_prefix import PROMPT_MASK, PROMPTS


def test_auto_takes_the_platform_row_and_an_explicit_value_wins():
  assert choose("rollout.decode_loop", "auto", "cpu") == "segments"
  assert choose("rollout.decode_loop", "auto", "gpu") == "bounded"
  assert choose("rollout.decode_loop", "auto", "cuda") == "bounded"  # a GPU backend's name
  assert choose("model.compute_dtype", "auto", "tpu") == "bfloat16"
  assert choose("model.attention_impl", "cudnn", "cpu") == "cudnn"
  assert [choose("model.context_layout", "auto", p) for p in ("cpu", "gpu", "tpu")] == [
      "contiguous", "contiguous", "zigzag"]
  for row in PLATFORM_TABLE.values():
    assert set(row) == {"cpu", "gpu", "tpu"} and all(why for _, why in row.values())
  assert len(table_lines("cpu")) == len(PLATFORM_TABLE)


@pytest.mark.parametrize("field, value", [("model.attention_impl", "flash"),
                                          ("model.context_layout", "striped"),
                                          ("rollout.decode_loop", "paged")])
def test_an_unknown_choice_is_one_sentence(field, value):
  config = get_defaults()
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ConfigError, match=f"{field}='{value}' is unknown"):
    validate(config)


def test_jax_nn_attention_equals_ours_in_scoring_and_in_the_sampler(tiny_cfg):
  params = perturbed_params(tiny_cfg, seed=3)
  library = dataclasses.replace(tiny_cfg, attention_impl="jax")
  tokens = jnp.asarray(np.concatenate([PROMPTS, PROMPTS[:, ::-1]], axis=1))
  mask = jnp.asarray(np.concatenate([PROMPT_MASK, PROMPT_MASK[:, ::-1]], axis=1))
  scored = [decoder_apply(cfg, params, tokens, positions_from_mask(mask), mask)[0]
            for cfg in (tiny_cfg, library)]
  np.testing.assert_allclose(np.asarray(scored[1]), np.asarray(scored[0]), atol=2e-5)
  common = dict(max_new_tokens=6, eos_id=2, pad_id=0, temperature=1.0, group_size=2)
  sampled = [generate(params, PROMPTS, PROMPT_MASK, jax.random.key(1), model_cfg=cfg, **common)
             for cfg in (tiny_cfg, library)]
  np.testing.assert_array_equal(np.asarray(sampled[1].completion_tokens),
                                np.asarray(sampled[0].completion_tokens))
  np.testing.assert_allclose(np.asarray(sampled[1].logprobs), np.asarray(sampled[0].logprobs),
                             atol=2e-5)


def test_the_compute_copy_casts_only_matrices_and_changes_no_token(tiny_cfg):
  params = perturbed_params(tiny_cfg, seed=3)
  copy = compute_copy(params, jnp.bfloat16)
  for before, after in zip(jax.tree.leaves(params), jax.tree.leaves(copy)):
    assert after.dtype == (jnp.bfloat16 if before.ndim >= 2 else before.dtype)
  bf16 = dataclasses.replace(tiny_cfg, compute_dtype="bfloat16")
  common = dict(model_cfg=bf16, max_new_tokens=6, eos_id=2, pad_id=0, temperature=1.0)
  got = [generate(p, PROMPTS, PROMPT_MASK, jax.random.key(1), **common) for p in (params, copy)]
  np.testing.assert_array_equal(np.asarray(got[0].completion_tokens),
                                np.asarray(got[1].completion_tokens))
  np.testing.assert_array_equal(np.asarray(got[0].logprobs), np.asarray(got[1].logprobs))


@pytest.mark.parametrize("top_k, top_p, sorts", [(0, 1.0, False), (3, 1.0, False),
                                                 (0, 0.9, True)])
def test_a_decode_step_sorts_the_vocabulary_only_under_top_p(tiny_cfg, top_k, top_p, sorts):
  sampling = Sampling(tiny_cfg, 4, 2, 0, temperature=1.0, top_k=top_k, top_p=top_p)
  params = perturbed_params(tiny_cfg, seed=3)
  hlo = _sample.lower(params, PROMPTS, PROMPT_MASK, jax.random.key(0), None,
                      sampling=sampling).as_text()
  assert ("stablehlo.sort" in hlo or " sort(" in hlo) == sorts
