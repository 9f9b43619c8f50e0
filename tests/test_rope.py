"""Scaled RoPE (models/rope.py): linear, dynamic, yarn and llama3 as transformers defines them --
inverse frequencies, logits of a left-padded batch, greedy tokens and export, against
transformers' LlamaForCausalLM."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from grpo_jax.models import hf, hf_export, rope
from grpo_jax.rollout.sampler import generate
from tests.fixtures import decoder_logits, transformers_logits

HEAD_DIM = 16
# Each type with parameters that move most frequencies at these tiny lengths (an original
# context of 16 positions against sequences of up to 40).
SCALINGS = {
    "linear": dict(factor=4.0),
    "dynamic": dict(factor=2.0),
    "yarn": dict(factor=4.0, original_max_position_embeddings=16),
    "yarn_mscale": dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=16,
                        mscale=0.8, mscale_all_dim=0.5, beta_fast=16, truncate=False),
    "yarn_no_factor": dict(rope_type="yarn", factor=None, original_max_position_embeddings=16),
    "llama3": dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16),
}


def rope_parameters(case: str, theta: float = 500.0) -> dict:
  params = dict(SCALINGS[case])
  return {"rope_type": params.pop("rope_type", case), "rope_theta": theta, **params}


def llama_config(case, **overrides):
  return transformers.LlamaConfig(**{**dict(
      vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, initializer_range=0.1,
      max_position_embeddings=64, tie_word_embeddings=True, attn_implementation="eager",
      rope_parameters=rope_parameters(case), bos_token_id=None, eos_token_id=96,
      pad_token_id=0), **overrides})


@pytest.mark.parametrize("case", sorted(SCALINGS))
def test_inverse_frequencies_equal_transformers(case):
  config = llama_config(case)
  theirs, their_factor = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu")
  model_cfg = hf.model_config_from_hf(config.to_dict())
  ours, our_factor = model_cfg.rope_frequencies()
  np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)
  assert our_factor == pytest.approx(their_factor, rel=1e-12)
  default = rope.default_inverse_frequencies(500.0, HEAD_DIM)
  moved = np.abs(ours / default - 1) > 1e-3
  # Every scaled type moves some frequencies but dynamic, which equals the default up to
  # max_position_embeddings (the only lengths a run reaches).
  assert moved.any() == (case != "dynamic"), (case, moved)


# A left-padded batch of up to 40 positions, past the original context of 16.
LENGTHS = (40, 23, 7)


def batch():
  rng = np.random.default_rng(0)
  width = max(LENGTHS)
  mask = np.arange(width)[None, :] >= width - np.array(LENGTHS)[:, None]
  tokens = np.where(mask, rng.integers(1, 96, (len(LENGTHS), width)), 0)
  return tokens, mask


def tiny_llama(case, tmp_path):
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(llama_config(case)).eval()
  model.save_pretrained(tmp_path)
  return model


@pytest.mark.parametrize("family, case", [("qwen2", "yarn"), ("qwen3", "linear"),
                                          ("mistral", "llama3")])
def test_every_family_takes_the_scaling(family, case, tmp_path):
  """Qwen2.5's long-context checkpoints use yarn; the scaling is the families' shared RoPE."""
  config_cls, model_cls = {
      "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
      "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
      "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[family]
  base = llama_config(case).to_dict()
  keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "initializer_range",
          "max_position_embeddings", "tie_word_embeddings", "rope_parameters", "eos_token_id",
          "pad_token_id")
  torch.manual_seed(0)
  model = model_cls(config_cls(**{k: base[k] for k in keys}, attn_implementation="eager",
                               **({"sliding_window": None} if family == "mistral" else {}))).eval()
  model.save_pretrained(tmp_path)
  tokens, mask = batch()
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  assert model_cfg.rope_type == rope_parameters(case)["rope_type"]
  diff = np.abs(decoder_logits(model_cfg, params, tokens, mask)
                - transformers_logits(model, tokens, mask))
  assert diff[mask].max() <= 1e-4


@pytest.mark.parametrize("case", ["linear", "yarn", "yarn_mscale", "llama3"])
def test_logits_equal_transformers_on_a_left_padded_batch(case, tmp_path):
  model = tiny_llama(case, tmp_path)
  tokens, mask = batch()
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  assert model_cfg.rope_type == rope_parameters(case)["rope_type"]
  ours = decoder_logits(model_cfg, params, tokens, mask)
  theirs = transformers_logits(model, tokens, mask)
  diff = np.abs(ours - theirs)[mask].max()
  assert diff <= 1e-4, diff
  # The scaling matters at these lengths: default RoPE gives other logits.
  plain = decoder_logits(dataclasses.replace(model_cfg, rope_type="default", rope_scaling=()),
                     params, tokens, mask)
  assert np.abs(plain - theirs)[mask].max() > 100 * max(diff, 1e-6)


def test_greedy_tokens_equal_transformers_generate_llama3(tmp_path):
  model = tiny_llama("llama3", tmp_path)
  tokens, mask = batch()
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  new = 20  # decoding to position 59, past the original context
  out = generate(params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask), jax.random.key(0),
                 model_cfg=model_cfg, max_new_tokens=new, temperature=0.0, eos_id=96, pad_id=0)
  with torch.no_grad():
    reference = model.generate(
        input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
        do_sample=False, max_new_tokens=new, eos_token_id=96, pad_token_id=0).numpy()
  completions, kept = np.asarray(out.completion_tokens), np.asarray(out.completion_mask)
  for row, ref in enumerate(reference[:, tokens.shape[1]:]):
    ref = list(ref)
    ref = ref[:ref.index(96) + 1] if 96 in ref else ref
    assert list(completions[row][kept[row]]) == ref, row


@pytest.mark.parametrize("case", ["yarn_mscale", "llama3"])
def test_export_round_trip_keeps_the_scaling(case, tmp_path):
  model = tiny_llama(case, tmp_path / "src")
  model_cfg, params = hf.load_hf_checkpoint(tmp_path / "src")
  out = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", model_type="llama")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert reloaded.config.rope_parameters == model.config.rope_parameters
  tokens, mask = batch()
  np.testing.assert_allclose(transformers_logits(reloaded, tokens, mask)[mask],
                             transformers_logits(model, tokens, mask)[mask], atol=1e-5)
  assert hf.load_hf_checkpoint(out)[0] == model_cfg


BASE = dict(model_type="llama", vocab_size=10, hidden_size=32, intermediate_size=40,
            num_hidden_layers=1, num_attention_heads=4)


@pytest.mark.parametrize("change, message", [
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}),
     "config.json rope_type='longrope' is not supported; use a checkpoint with one of default, "
     "dynamic, linear, llama3, yarn."),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}),
     "config.json rope_type='llama3' needs low_freq_factor in rope_parameters; use the "
     "config.json that came with the checkpoint."),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                           "partial_rotary_factor": 0.5}),
     "config.json rope_parameters partial_rotary_factor=0.5 (RoPE on part of each head) is not "
     "supported; use a checkpoint that rotates whole heads."),
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}),
     "config.json rope_type='dynamic' needs max_position_embeddings (its frequencies change "
     "past it); set max_position_embeddings in config.json."),
])
def test_rope_config_errors(change, message):
  with pytest.raises(ValueError) as err:
    hf.model_config_from_hf({**BASE, **change})
  assert str(err.value) == message


def test_older_rope_scaling_field_reads_like_rope_parameters():
  old = hf.model_config_from_hf({**BASE, "rope_theta": 5e5, "max_position_embeddings": 131072,
                                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                  "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 8192}})
  new = hf.model_config_from_hf({**BASE, "max_position_embeddings": 131072, "rope_parameters": {
      "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
  assert old == new and new.rope_theta == 5e5 and new.rope_type == "llama3"
