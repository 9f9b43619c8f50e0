"""Sliding windows against transformers 5 on tiny random checkpoints: Gemma 2 and Gemma 3
(text) (grpo_jax/models/gemma.py), Mistral (every layer) and Qwen2 (from max_window_layers on):
logits on a left-padded batch longer than the window, greedy tokens against generate past the
window (the sampler's KV cache), the shared-prompt and chunked teacher-forced passes against
the plain one, and the export's round trip."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from grpo_jax.models import hf, hf_export
from grpo_jax.rollout.sampler import generate
from tests.fixtures import decoder_logits, transformers_logits

WINDOW = 5
LENGTHS = (14, 9, 3)  # a left-padded batch, the longest rows past the window
EOS = 60


def _common(**overrides):
  return dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              query_pre_attn_scalar=24, sliding_window=WINDOW, max_position_embeddings=256,
              rms_norm_eps=1e-6, initializer_range=0.2, attn_implementation="eager",
              eos_token_id=EOS, pad_token_id=0, bos_token_id=1, **overrides)


def gemma2(tmp_path):
  config = transformers.Gemma2Config(**_common(attn_logit_softcapping=2.0,
                                               final_logit_softcapping=3.0))
  return _saved(transformers.Gemma2ForCausalLM, config, tmp_path)


def gemma3(tmp_path):
  config = transformers.Gemma3TextConfig(**_common(
      layer_types=["sliding_attention", "sliding_attention", "full_attention",
                   "sliding_attention"],
      rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                          "rope_theta": 1000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 30.0}}))
  return _saved(transformers.Gemma3ForCausalLM, config, tmp_path)


def _saved(model_cls, config, tmp_path):
  torch.manual_seed(0)
  model = model_cls(config).eval()
  with torch.no_grad():  # the norms start at 0 (a scale of 1): give them values to get wrong
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0.0, 0.3)
  model.save_pretrained(tmp_path)
  return model


def mistral(tmp_path):
  keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "sliding_window",
          "max_position_embeddings", "rms_norm_eps", "initializer_range", "attn_implementation",
          "eos_token_id", "pad_token_id", "bos_token_id")
  config = transformers.MistralConfig(**{k: v for k, v in _common().items() if k in keys})
  return _saved(transformers.MistralForCausalLM, config, tmp_path)


def qwen2(tmp_path):
  keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "sliding_window",
          "max_position_embeddings", "rms_norm_eps", "initializer_range", "attn_implementation",
          "eos_token_id", "pad_token_id", "bos_token_id")
  config = transformers.Qwen2Config(**{k: v for k, v in _common().items() if k in keys},
                                    use_sliding_window=True, max_window_layers=2)
  return _saved(transformers.Qwen2ForCausalLM, config, tmp_path)


FAMILIES = {"gemma2": gemma2, "gemma3_text": gemma3, "mistral": mistral, "qwen2": qwen2}


def batch():
  rng = np.random.default_rng(0)
  width = max(LENGTHS)
  mask = np.arange(width)[None, :] >= width - np.array(LENGTHS)[:, None]
  return np.where(mask, rng.integers(2, EOS, (len(LENGTHS), width)), 0), mask


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_transformers_on_a_left_padded_batch(family, tmp_path):
  model = FAMILIES[family](tmp_path)
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  assert model_cfg.sliding_window == WINDOW
  assert model_cfg.family == ("gemma" if family.startswith("gemma") else "llama")
  tokens, mask = batch()
  theirs = transformers_logits(model, tokens, mask)
  diff = np.abs(decoder_logits(model_cfg, params, tokens, mask) - theirs)[mask].max()
  assert diff <= 1e-4, diff
  # The window matters at these lengths: full attention everywhere gives other logits.
  import dataclasses  # noqa: PLC0415
  full = decoder_logits(dataclasses.replace(model_cfg, sliding_window=0), params, tokens, mask)
  assert np.abs(full - theirs)[mask].max() > 100 * max(diff, 1e-6)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_tokens_past_the_window_equal_generate(family, tmp_path):
  model = FAMILIES[family](tmp_path)
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  tokens, mask = batch()
  new = 12  # to position 26, the window 5
  out = generate(params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask), jax.random.key(0),
                 model_cfg=model_cfg, max_new_tokens=new, temperature=0.0, eos_id=EOS,
                 pad_id=0)
  with torch.no_grad():
    reference = model.generate(
        input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
        do_sample=False, max_new_tokens=new, eos_token_id=EOS, pad_token_id=0).numpy()
  completions, kept = np.asarray(out.completion_tokens), np.asarray(out.completion_mask)
  for row, ref in enumerate(reference[:, tokens.shape[1]:]):
    ref = list(ref)
    ref = ref[:ref.index(EOS) + 1] if EOS in ref else ref
    assert list(completions[row][kept[row]]) == ref, row


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_loads_back_in_transformers_with_the_same_logits(family, tmp_path):
  model = FAMILIES[family](tmp_path / "src")
  model_cfg, params = hf.load_hf_checkpoint(tmp_path / "src")
  out = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", model_type=family)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  tokens, mask = batch()
  np.testing.assert_allclose(transformers_logits(reloaded, tokens, mask)[mask],
                             transformers_logits(model, tokens, mask)[mask], atol=1e-5)
  assert hf.load_hf_checkpoint(out)[0] == model_cfg


def test_gemma_scoring_paths_equal_the_plain_forward(tmp_path):
  """The RL update's teacher-forced passes on a Gemma 2 model (soft-capped logits, windows):
  shared-prompt and chunked scoring give the plain pass's completion log-probs."""
  import dataclasses  # noqa: PLC0415
  import types  # noqa: PLC0415

  from grpo_jax.models.scoring import completion_scores  # noqa: PLC0415
  gemma2(tmp_path)
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  rng = np.random.default_rng(1)
  prompts, prompt_mask = batch()
  group = 2
  seqs = types.SimpleNamespace(
      prompt_tokens=jnp.asarray(np.repeat(prompts, group, 0), jnp.int32),
      prompt_mask=jnp.asarray(np.repeat(prompt_mask, group, 0)),
      completion_tokens=jnp.asarray(rng.integers(2, EOS, (6, 8)), jnp.int32),
      completion_mask=jnp.asarray(np.arange(8)[None] < rng.integers(1, 9, (6, 1))))
  plain = np.asarray(completion_scores(params, model_cfg, seqs)[0])
  grouped = np.asarray(completion_scores(params, model_cfg, seqs, prompt_group=group)[0])
  chunked = np.asarray(completion_scores(params, dataclasses.replace(model_cfg, logits_chunk=3),
                                         seqs)[0])
  m = np.asarray(seqs.completion_mask)
  assert np.abs(grouped - plain)[m].max() <= 1e-5
  assert np.abs(chunked - plain)[m].max() <= 1e-5


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_a_config_without_tie_word_embeddings_ties_as_transformers_does(family, tmp_path):
  """Released Gemma configs (e.g. google/gemma-2-2b's) leave tie_word_embeddings out and their
  weights have no lm_head: the family's default (transformers' config class's, True) ties them,
  and the logits equal transformers' on the same folder."""
  model = FAMILIES[family](tmp_path)
  config_file = tmp_path / "config.json"
  config = json.loads(config_file.read_text())
  del config["tie_word_embeddings"]
  config_file.write_text(json.dumps(config))
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  assert model_cfg.tie_embeddings
  tokens, mask = batch()
  theirs = transformers_logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval(),
                               tokens, mask)
  assert np.abs(decoder_logits(model_cfg, params, tokens, mask) - theirs)[mask].max() < 1e-4
  del model


def test_each_familys_tie_default_is_transformers():
  from grpo_jax.models.families.registry import MODEL_FAMILIES  # noqa: PLC0415
  for model_type, family in MODEL_FAMILIES.items():
    default = transformers.AutoConfig.for_model(model_type).tie_word_embeddings
    assert family.tie_default == default, model_type
