"""The Math-Shepherd-style PRM against transformers' Qwen2ForCausalLM (torch, fp32), and its
step rewards against plain loops and process_advantages."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import hf
from grpo_jax.models.process_reward_model import (prm_token_scores, step_end_mask,
                                                   step_rewards_from_token_scores)
from grpo_jax.rl.token_advantages import process_advantages
from tests.hf_fixtures import save_tiny_qwen2

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAD, SEP = 0, 201  # the tiny tokenizer's pad and "\n" (its "\n\n" is two tokens)
GOOD, BAD = 343, 394  # " +" and " -"
PROMPT_LENGTHS = [3, 5, 2, 4]
# Completion rows (right-padded to N = 9): separators at varied places; row 1 ends on one
# (no extra final step) and has 4 step ends; row 2 has none (and a separator in its padding).
COMPLETION_SEPS = [[2, 5], [0, 1, 3, 5], [], [1, 6]]
COMPLETION_LENGTHS = [9, 6, 4, 7]
N, P = 9, 5


def _batch():
  rng = np.random.default_rng(0)
  prompt = np.full((4, P), PAD, np.int64)
  prompt_mask = np.zeros((4, P), bool)
  completion = np.full((4, N), PAD, np.int64)
  completion_mask = np.zeros((4, N), bool)
  for b, (p, n, seps) in enumerate(zip(PROMPT_LENGTHS, COMPLETION_LENGTHS, COMPLETION_SEPS)):
    prompt[b, P - p:] = rng.integers(3, 200, p)
    prompt_mask[b, P - p:] = True
    completion[b, :n] = rng.integers(3, 200, n)
    completion[b, seps] = SEP
    completion_mask[b, :n] = True
  prompt[1, 1] = SEP  # a separator in a prompt is not a step end
  completion[2, 6] = SEP  # nor one in the padding
  return prompt, prompt_mask, completion, completion_mask


def _load_prm(path, tie=True):
  """The tiny Qwen2 saved by transformers, its weights spread out (norm weights and biases not
  ones / zeros, a larger embedding) so that the label logits differ by O(1), re-saved."""
  save_tiny_qwen2(path, tie=tie)
  model = transformers.Qwen2ForCausalLM.from_pretrained(path).float().eval()
  torch.manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
      elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
        p.mul_(6.0)
  model.save_pretrained(path)
  model_cfg, params = hf.load_hf_checkpoint(path)
  assert model_cfg.tie_embeddings == tie
  return model, model_cfg, params


@pytest.fixture(scope="module")
def prm(tmp_path_factory):
  return _load_prm(tmp_path_factory.mktemp("prm"))


def _our_scores(model_cfg, params):
  prompt, prompt_mask, completion, completion_mask = _batch()
  fn = jax.jit(functools.partial(prm_token_scores, model_cfg=model_cfg, separator_id=SEP,
                                 good_id=GOOD, bad_id=BAD))
  scores, ends = fn(params, prompt_tokens=prompt, prompt_mask=prompt_mask,
                    completion_tokens=completion, completion_mask=completion_mask)
  return np.asarray(scores), np.asarray(ends)


@pytest.fixture(scope="module")
def scored(prm):
  return _our_scores(*prm[1:])


def _torch_scores(model):
  """softmax over the [good, bad] logits at every real completion token, each row run alone
  and unpadded (positions 0..L-1, no padding convention involved); 0 at padding."""
  prompt, prompt_mask, completion, completion_mask = _batch()
  out = np.zeros((4, N), np.float32)
  with torch.no_grad():
    for b in range(4):
      ids = np.concatenate([prompt[b][prompt_mask[b]], completion[b][completion_mask[b]]])
      logits = model(input_ids=torch.tensor(ids[None])).logits[0]
      start = int(prompt_mask[b].sum())
      pair = logits[start:, [GOOD, BAD]].softmax(dim=-1)[:, 0]
      out[b, :len(pair)] = pair.numpy()
  return out


def _loop_step_ends(completion, completion_mask, score_last):
  ends = np.zeros(completion.shape, bool)
  for b in range(completion.shape[0]):
    real = [t for t in range(completion.shape[1]) if completion_mask[b, t]]
    for t in real:
      ends[b, t] = completion[b, t] == SEP
    if score_last and real:
      ends[b, real[-1]] = True
  return ends


def _loop_step_rewards(scores, ends, k):
  rewards = np.zeros((len(scores), k), np.float32)
  index = np.zeros((len(scores), k), np.int32)
  mask = np.zeros((len(scores), k), bool)
  for b in range(len(scores)):
    at = [t for t in range(scores.shape[1]) if ends[b, t]]
    if len(at) > k:
      at = at[:k - 1] + at[-1:]
    for j, t in enumerate(at):
      rewards[b, j], index[b, j], mask[b, j] = scores[b, t], t, True
  return rewards, index, mask


def _assert_scores_match(model, scores, ends):
  expected = _torch_scores(model)
  completion_mask = _batch()[3]
  assert scores.dtype == np.float32 and scores.shape == (4, N)
  assert 0.1 < np.std(expected[completion_mask]) and np.all(scores[~completion_mask] == 0)
  np.testing.assert_allclose(scores[ends], expected[ends], atol=1e-4, rtol=0)
  np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)


def test_scores_match_transformers(prm, scored):
  _assert_scores_match(prm[0], *scored)


def test_untied_lm_head_scores_match_transformers(tmp_path):
  model, model_cfg, params = _load_prm(tmp_path, tie=False)
  _assert_scores_match(model, *_our_scores(model_cfg, params))


@pytest.mark.parametrize("score_last", [True, False])
def test_step_ends_match_a_loop(score_last):
  _, _, completion, completion_mask = _batch()
  ends = np.asarray(step_end_mask(completion, completion_mask, SEP, score_last))
  np.testing.assert_array_equal(ends, _loop_step_ends(completion, completion_mask, score_last))
  if score_last:
    assert [list(np.flatnonzero(r)) for r in ends] == [[2, 5, 8], [0, 1, 3, 5], [3], [1, 6]]


def test_scored_step_ends(scored):
  _, ends = scored
  _, _, completion, completion_mask = _batch()
  np.testing.assert_array_equal(ends, _loop_step_ends(completion, completion_mask, True))


@pytest.mark.parametrize("k", [1, 3, 4, 6])
def test_step_rewards_match_a_loop(scored, k):
  scores, ends = scored
  out = jax.jit(step_rewards_from_token_scores, static_argnums=2)(scores, ends, k)
  rewards, index, mask = map(np.asarray, out)
  expected = _loop_step_rewards(scores, ends, k)
  assert (rewards.dtype, index.dtype, mask.dtype) == (np.float32, np.int32, bool)
  np.testing.assert_array_equal(rewards, expected[0])
  np.testing.assert_array_equal(index, expected[1])
  np.testing.assert_array_equal(mask, expected[2])
  if k == 3:  # row 1 has 4 ends: its first 2 and its last are kept; row 2 has only its last
    assert list(index[1]) == [0, 1, 5] and list(index[2][mask[2]]) == [3]


def test_no_separator_and_no_last_gives_no_steps():
  scores = jnp.full((2, 4), 0.7)
  ends = jnp.array([[False] * 4, [False, True, False, True]])
  rewards, index, mask = step_rewards_from_token_scores(scores, ends, 2)
  np.testing.assert_array_equal(mask, [[False, False], [True, True]])
  np.testing.assert_array_equal(index, [[0, 0], [1, 3]])
  np.testing.assert_allclose(rewards, [[0.0, 0.0], [0.7, 0.7]])


def test_feeds_process_advantages(scored):
  scores, ends = scored
  completion_mask = _batch()[3]
  step = step_rewards_from_token_scores(scores, ends, 3)
  advantages = np.asarray(process_advantages(*step, group_size=2, token_mask=completion_mask))
  assert advantages.shape == (4, N) and np.all(np.isfinite(advantages))
  assert np.all(advantages[~completion_mask] == 0) and np.any(advantages != 0)


def test_bad_inputs(prm):
  _, model_cfg, params = prm
  prompt, prompt_mask, completion, completion_mask = _batch()
  args = (params, model_cfg, prompt, prompt_mask, completion, completion_mask)
  with pytest.raises(ValueError, match="good_id and bad_id are both 13"):
    prm_token_scores(*args, SEP, 13, 13)
  with pytest.raises(ValueError, match=r"bad_id=400 is not a token id .* \[0, 400\)"):
    prm_token_scores(*args, SEP, GOOD, 400)
  with pytest.raises(ValueError, match="completion_tokens .* must be"):
    prm_token_scores(params, model_cfg, prompt, prompt_mask, completion[:, :3], completion_mask,
                     SEP, GOOD, BAD)
  with pytest.raises(ValueError, match="max_steps=0"):
    step_rewards_from_token_scores(jnp.zeros((2, 3)), jnp.zeros((2, 3), bool), 0)


def test_scores_of_a_soft_capped_model_are_those_of_its_logits():
  """Gemma 2 caps its final logits (final_softcap): the label logits were the uncapped
  projection, so a step's score sigmoid(z_good - z_bad) was off by up to 0.19 here."""
  from grpo_jax.models.decoder import decoder_apply, positions_from_mask  # noqa: PLC0415
  from tests.fixtures import perturbed_params, tiny_model_config  # noqa: PLC0415
  cfg = tiny_model_config(family="gemma", final_softcap=2.0, query_pre_attn_scalar=8.0)
  params = jax.tree.map(lambda x: x * 3, perturbed_params(cfg))  # logits large enough to cap
  pt, pm = jnp.array([[0, 3, 4], [5, 6, 7]]), jnp.array([[0, 1, 1], [1, 1, 1]])
  ct, cm = jnp.array([[8, 9, 2], [10, 2, 0]]), jnp.array([[1, 1, 1], [1, 1, 0]])
  scores, _ = prm_token_scores(params, cfg, pt, pm, ct, cm, separator_id=2, good_id=11,
                               bad_id=12)
  mask = jnp.concatenate([pm, cm], 1).astype(bool)
  logits, _ = decoder_apply(cfg, params, jnp.concatenate([pt, ct], 1), positions_from_mask(mask),
                            mask, None, 0)
  z = logits[:, 3:]
  expected = jnp.where(cm.astype(bool), jax.nn.sigmoid(z[..., 11] - z[..., 12]), 0.0)
  np.testing.assert_allclose(np.asarray(scores), np.asarray(expected), atol=1e-6)
