"""GGUF import (grpo_jax/models/gguf.py): tiny Llama GGUFs in each tensor type, written the way
llama.cpp's converter writes them (tests/gguf_fixtures.py), imported and run by our decoder,
against transformers loading the same GGUF file; the folder loads in transformers too."""

import json
import math
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers

from grpo_jax.data.tokenizer import load_hf_tokenizer
from grpo_jax.errors import InputError
from grpo_jax.models import gguf as gguf_import
from grpo_jax.models import hf
from tests.fixtures import decoder_logits, transformers_logits
from tests.gguf_fixtures import TYPES, write_tiny_gguf
from tests.test_hf import MASK

TOKENS = np.array([[0, 0, 0, 5, 17, 33, 2, 90],
                   [4, 8, 15, 16, 23, 42, 61, 296],
                   [0, 0, 0, 0, 0, 0, 7, 313]], np.int64)  # left-padded, ids < 320
CHAT = [{"role": "user", "content": "Natalia sold 48 clips in April. How many in May?"}]


def ours(folder):
  """(ModelConfig, params, logits) of our loader and decoder on the imported folder."""
  model_cfg, params = hf.load_hf_checkpoint(folder)
  return model_cfg, params, decoder_logits(model_cfg, params, TOKENS, MASK)


def from_gguf(path):
  """transformers' own GGUF loader (float32)."""
  return transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def max_diff(a, b):
  return float(np.abs(a[MASK] - b[MASK]).max())


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("qtype", TYPES)
def test_imported_gguf_matches_transformers_loading_the_same_file(qtype, tie, tmp_path):
  path = tmp_path / f"tiny-{qtype}.gguf"
  original = write_tiny_gguf(path, qtype, tie=tie, seed=TYPES.index(qtype))
  out = gguf_import.import_gguf(path, tmp_path / "out")
  model_cfg, params, logits = ours(out)
  assert model_cfg.tie_embeddings == tie
  assert (model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.head_dim) == (4, 2, 16)
  assert (model_cfg.rope_theta, model_cfg.rms_norm_eps) == (500_000.0, 1e-5)
  reference = transformers_logits(from_gguf(path), TOKENS, MASK)
  diff = max_diff(logits, reference)
  print(f"{qtype} {'tied' if tie else 'untied'}: max |ours - transformers(gguf)| = {diff:.2e}")
  assert diff <= 1e-4
  assert np.abs(reference[MASK]).max() > 1.0  # logits that mean something
  if qtype == "F32":  # lossless: the model the file was written from, too
    assert max_diff(logits, transformers_logits(original, TOKENS, MASK)) <= 1e-4


def test_the_folder_loads_in_transformers_and_round_trips_bf16(tmp_path):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, "Q4_1", tie=False)
  out = gguf_import.import_gguf(path, tmp_path / "out")
  reference = transformers_logits(from_gguf(path), TOKENS, MASK)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(reloaded).__name__ == "LlamaForCausalLM"
  assert max_diff(transformers_logits(reloaded, TOKENS, MASK), reference) <= 1e-5
  config = json.loads((out / "config.json").read_text())
  assert config["rms_norm_eps"] == 1e-5 and config["max_position_embeddings"] == 256
  assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
  # bfloat16 weights: the float32 import's params rounded to bfloat16, nothing else.
  _, params32 = hf.load_hf_checkpoint(out)
  _, params16 = hf.load_hf_checkpoint(gguf_import.import_gguf(path, tmp_path / "bf16",
                                                              dtype="bfloat16"))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(
      np.asarray(a, np.float32), np.asarray(np.asarray(b).astype("bfloat16"), np.float32)),
      params16, params32)


def test_tokenizer_and_chat_template_equal_transformers_gguf_tokenizer(tmp_path):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, "F16")
  out = gguf_import.import_gguf(path, tmp_path / "out")
  ours_tok = load_hf_tokenizer(str(out))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
  assert (ours_tok.eos_token, ours_tok.pad_token, ours_tok.bos_token) == (
      theirs.eos_token, theirs.pad_token, theirs.bos_token) == (
      "<|im_end|>", "<|endoftext|>", "<|im_start|>")
  chat = [ours_tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False),
          theirs.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)]
  assert chat[0] == chat[1] and chat[0].startswith("<|im_start|>user\n")
  for text in [chat[0], "Natalia sold 48 clips in April.\n#### 72", "  two  spaces é"]:
    assert ours_tok(text)["input_ids"] == theirs(text)["input_ids"]


def test_import_needs_no_torch(tmp_path):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, "Q8_0")
  code = ("import sys; sys.modules['torch'] = None; from grpo_jax.models.gguf import main; "
          f"sys.exit(main([{str(path)!r}, '--out', {str(tmp_path / 'out')!r}]))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip().splitlines()[-1] == str(tmp_path / "out")
  assert (tmp_path / "out" / "tokenizer.json").is_file()


def _one_sentence(message: str) -> str:
  assert "\n" not in message and message.endswith(".") and message.count(". ") == 0, message
  return message


def test_an_unsupported_architecture_is_one_sentence(tmp_path):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, "F32", arch="qwen2")
  with pytest.raises(InputError) as err:
    gguf_import.import_gguf(path, tmp_path / "out")
  message = _one_sentence(str(err.value))
  assert str(path) in message and "'qwen2'" in message and "'llama'" in message
  assert not (tmp_path / "out").exists()  # checked before anything is written


def test_an_unsupported_tensor_type_is_one_sentence(tmp_path, capsys):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, "Q4_0", norm_dtype=np.float64)  # F64 norms: gguf cannot dequantize
  rc = gguf_import.main([str(path), "--out", str(tmp_path / "out")])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err.startswith("error: ") and len(err.splitlines()) == 1
  message = _one_sentence(err)
  assert "blk.0.attn_norm.weight" in message and "F64" in message and "Q4_1" in message
  assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_one_sentence(tmp_path):
  path = tmp_path / "bad.gguf"
  path.write_bytes(b"not a gguf file at all" * 10)
  with pytest.raises(InputError) as err:
    gguf_import.import_gguf(path, tmp_path / "out")
  assert str(path) in _one_sentence(str(err.value))


def test_large_models_are_sharded_and_load(tmp_path, monkeypatch):
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, "F32")
  _, params = hf.load_hf_checkpoint(gguf_import.import_gguf(path, tmp_path / "one"))
  monkeypatch.setattr(gguf_import, "SHARD_BYTES", 40_000)
  out = gguf_import.import_gguf(path, tmp_path / "sharded")
  assert len(list(out.glob("model-*-of-*.safetensors"))) > 2
  assert not (out / "model.safetensors").exists()
  _, sharded = hf.load_hf_checkpoint(out)
  jax.tree.map(np.testing.assert_array_equal, sharded, params)


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def llama_cpp_rope_factors(theta, dim, factor, low, high, context):
  """The divisors llama.cpp's convert_hf_to_gguf.py writes as rope_freqs for llama3 scaling."""
  out = []
  for i in range(0, dim, 2):
    wavelength = 2 * math.pi * theta ** (i / dim)
    if wavelength < context / high:
      out.append(1.0)
    elif wavelength > context / low:
      out.append(factor)
    else:
      smooth = (context / wavelength - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.array(out, np.float32)


def test_llama3_rope_freqs_import_as_rope_type_llama3(tmp_path):
  path = tmp_path / "llama3.gguf"
  factors = llama_cpp_rope_factors(500_000.0, 16, 8.0, 1.0, 4.0, 64)
  assert 1.0 < factors[1] < 8.0 and factors[0] == 1.0 and factors[-1] == 8.0  # all 3 regimes
  original = write_tiny_gguf(path, "F32", rope_parameters=LLAMA3, rope_factors=factors)
  out = gguf_import.import_gguf(path, tmp_path / "out")
  assert json.loads((out / "config.json").read_text())["rope_parameters"] == LLAMA3
  model_cfg, _, logits = ours(out)
  assert model_cfg.rope_type == "llama3"
  assert max_diff(logits, transformers_logits(original, TOKENS, MASK)) <= 1e-4
  plain = write_tiny_gguf(tmp_path / "plain.gguf", "F32")  # same weights, default RoPE
  assert max_diff(transformers_logits(plain, TOKENS, MASK),
                  transformers_logits(original, TOKENS, MASK)) > 1e-2


def test_rope_freqs_of_no_llama3_scaling_is_one_sentence(tmp_path):
  path = tmp_path / "odd.gguf"
  write_tiny_gguf(path, "F32", rope_factors=np.linspace(1.0, 3.0, 8))
  with pytest.raises(InputError) as err:
    gguf_import.import_gguf(path, tmp_path / "out")
  assert str(err.value) == (f"{path} has a rope_freqs tensor (divisors 1 to 3) that matches no "
                            f"llama3 RoPE scaling; import a Llama GGUF with default or Llama 3.x "
                            f"RoPE.")


@pytest.mark.parametrize("method, value, words", [
    ("add_block_count", 3, "llama.block_count=3 but holds tensors of 2 layers (blk.0 to blk.1)"),
    ("add_embedding_length", 128,
     "llama.embedding_length=128 but its token_embd.weight is 64 wide"),
    ("add_feed_forward_length", 96, "llama.feed_forward_length=96 but its blk.0.ffn_up.weight has "
                                    "128 rows"),
    ("add_pad_token_id", 100_000, "tokenizer.ggml.padding_token_id=100000 but only 3")])
def test_metadata_that_disagrees_with_the_tensors_is_one_sentence(method, value, words, tmp_path,
                                                                  monkeypatch):
  """A header edited or damaged: the key, both sizes and the fix, before
  anything is written, not a config.json of the wrong size or a misnamed RoPE fault."""
  import gguf  # noqa: PLC0415
  original = getattr(gguf.GGUFWriter, method)
  monkeypatch.setattr(gguf.GGUFWriter, method, lambda self, n: original(self, value))
  path = tmp_path / "tiny.gguf"
  write_tiny_gguf(path, "F32")
  with pytest.raises(InputError) as err:
    gguf_import.import_gguf(path, tmp_path / "out")
  message = _one_sentence(str(err.value))
  assert words in message and "gguf-set-metadata" in message, message
  assert not (tmp_path / "out").exists()
