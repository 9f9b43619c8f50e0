"""Outcome reward models against transformers' *ForSequenceClassification (torch, fp32)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from grpo_jax.models.reward_model import (export_reward_model, init_reward_model,
                                          load_reward_model, reward_scores, sequence_reward)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAD = 0


def _save_classifier(directory, family: str, num_labels: int = 1, seed: int = 0):
  """A random 2-layer transformers classifier of `family`, saved in fp32."""
  torch.manual_seed(seed)
  common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                pad_token_id=PAD, num_labels=num_labels, tie_word_embeddings=False)
  if family == "qwen2":
    config, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForSequenceClassification
  elif family == "qwen3":
    config = transformers.Qwen3Config(head_dim=16, **common)
    cls = transformers.Qwen3ForSequenceClassification
  else:
    config, cls = transformers.LlamaConfig(**common), transformers.LlamaForSequenceClassification
  model = cls(config).float().eval()
  with torch.no_grad():  # a score head of a realistic size (the random init is tiny)
    model.score.weight.normal_(0.0, 0.5)
  model.save_pretrained(directory)
  return model


def _padded_batch(right: bool):
  """4 rows of lengths 7, 12, 3, 12 over token ids 1..96 (0 is the pad), padded on one side."""
  rng = np.random.default_rng(1)
  lengths = [7, 12, 3, 12]
  tokens = np.zeros((4, 12), np.int64)
  mask = np.zeros((4, 12), bool)
  for i, n in enumerate(lengths):
    cols = slice(0, n) if right else slice(12 - n, 12)
    tokens[i, cols] = rng.integers(1, 97, n)
    mask[i, cols] = True
  return tokens, mask


def _torch_scores(model, tokens, mask):
  """transformers' scores, each row run alone and unpadded (no padding convention involved)."""
  with torch.no_grad():
    return np.stack([model(input_ids=torch.tensor(t[m][None])).logits[0].numpy()
                     for t, m in zip(tokens, mask)])


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_scores_match_transformers_on_a_padded_batch(family, tmp_path):
  model = _save_classifier(tmp_path, family, num_labels=2)
  cfg, params, labels = load_reward_model(tmp_path)
  assert labels == 2
  for right in (True, False):
    tokens, mask = _padded_batch(right)
    ours = np.asarray(reward_scores(params, cfg, jnp.asarray(tokens), jnp.asarray(mask)))
    theirs = _torch_scores(model, tokens, mask)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
  # transformers on the right-padded batch itself (its own last-non-pad rule) agrees too
  tokens, mask = _padded_batch(True)
  with torch.no_grad():
    batched = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits
  ours = np.asarray(reward_scores(params, cfg, jnp.asarray(tokens), jnp.asarray(mask)))
  np.testing.assert_allclose(ours, batched.numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_exported_reward_model_loads_in_transformers_with_the_same_scores(family, tmp_path):
  _save_classifier(tmp_path / "src", family)
  cfg, params, _ = load_reward_model(tmp_path / "src")
  # a trained head and backbone: perturb both, so the export carries new values
  params = jax.tree.map(lambda x: x * 1.01, params)
  export_reward_model(params, cfg, tmp_path / "out", model_type=family, pad_token_id=PAD)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      tmp_path / "out").float().eval()
  tokens, mask = _padded_batch(True)
  ours = np.asarray(reward_scores(params, cfg, jnp.asarray(tokens), jnp.asarray(mask)))
  np.testing.assert_allclose(ours, _torch_scores(model, tokens, mask), atol=1e-4, rtol=0)
  cfg2, params2, _ = load_reward_model(tmp_path / "out")
  np.testing.assert_allclose(np.asarray(reward_scores(params2, cfg2, jnp.asarray(tokens),
                                                      jnp.asarray(mask))), ours, atol=1e-6)


def test_a_causal_lm_folder_starts_a_reward_model_at_zero(tmp_path):
  from tests.hf_fixtures import save_tiny_qwen2
  save_tiny_qwen2(tmp_path)
  cfg, params, labels = load_reward_model(tmp_path)
  assert labels == 1 and "lm_head" not in params["backbone"]
  p = jnp.array([[0, 5, 6]]), jnp.array([[False, True, True]])
  c = jnp.array([[7, 8, 0]]), jnp.array([[True, True, False]])
  np.testing.assert_array_equal(np.asarray(sequence_reward(params, cfg, *p, *c)), [0.0])
  fresh = init_reward_model(cfg, jax.random.key(0))
  assert fresh["score"]["kernel"].shape == (cfg.hidden_size, 1)


def test_a_reward_model_with_its_own_tokenizer_reads_re_tokenised_text(tmp_path):
  """The policy's ids (the addition task's characters) are decoded, wrapped in the RM's chat
  template and re-tokenised with its tokenizer: the score is transformers' on that text."""
  from configs import grpo_tiny
  from grpo_jax.train.run.reward_models import build_reward_sources
  from grpo_jax.train.run.sections import ModelSection, RewardSection  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task
  from tests.hf_fixtures import save_tiny_tokenizer
  tokenizer = save_tiny_tokenizer(tmp_path)
  torch.manual_seed(0)
  config = transformers.Qwen2Config(
      vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
      num_labels=1)
  model = transformers.Qwen2ForSequenceClassification(config).float().eval()
  with torch.no_grad():
    model.score.weight.normal_(0.0, 0.5)
  model.save_pretrained(tmp_path)
  run = grpo_tiny.get_config()
  run.reward.models = [dict(path=str(tmp_path), name="rm")]
  task = build_task(run)
  sources = build_reward_sources(RewardSection.of(run), ModelSection.of(run), task)
  assert sources.models[0].tokenizer is not None  # another vocabulary: the re-tokenising path
  prompts = task.train_batch(0, 3, 0)
  tokens, mask = prompts.target_tokens[[0, 0, 1, 1, 2, 2]], prompts.target_mask[[0, 0, 1, 1, 2, 2]]
  _, _, parts = sources.score(task, prompts, tokens, mask, 2, "raise")
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)  # the folder's, as users have it
  expected = []
  for row in range(6):
    p = row // 2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": task.tokenizer.decode(prompts.prompt_tokens[p])},
         {"role": "assistant", "content": task.tokenizer.decode(tokens[row])}], tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
      expected.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0]))
  np.testing.assert_allclose(parts["rm"], expected, atol=1e-4)


def test_a_reward_model_folder_without_a_tokenizer_read_as_own_is_one_sentence(tmp_path):
  """tokenizer='own' on a folder without tokenizer files (the RM stage's export has none) ended
  in transformers' ValueError traceback."""
  from configs import grpo_tiny  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from grpo_jax.train.run.reward_models import build_reward_sources  # noqa: PLC0415
  from grpo_jax.train.run.sections import ModelSection, RewardSection  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  config = transformers.Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                                    num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, num_labels=1)
  transformers.Qwen2ForSequenceClassification(config).save_pretrained(tmp_path)
  run = grpo_tiny.get_config()
  run.reward.models = [dict(path=str(tmp_path), tokenizer="own")]
  with pytest.raises(ConfigError, match=rf"^reward.models\[0\].tokenizer='own' reads the "
                     rf"tokenizer of {tmp_path}, which does not load \(.*\); copy the tokenizer "
                     rf"files there \(an exported reward model has none\), or set "
                     rf"reward.models\[0\].tokenizer='policy'.$"):
    build_reward_sources(RewardSection.of(run), ModelSection.of(run), build_task(run))
