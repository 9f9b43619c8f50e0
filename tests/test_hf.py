"""Hugging Face checkpoints: our loader and exporter against transformers' PyTorch models."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from grpo_jax.errors import InputError
from grpo_jax.models import hf, hf_export
from grpo_jax.models.decoder import init_params
from tests.fixtures import decoder_logits, transformers_logits

# Left-padded batch (pad id 0); the last row is mostly padding.
TOKENS = np.array([[0, 0, 0, 5, 17, 33, 2, 90],
                   [4, 8, 15, 16, 23, 42, 61, 96],
                   [0, 0, 0, 0, 0, 0, 7, 3]], np.int64)
MASK = np.array([[0, 0, 0, 1, 1, 1, 1, 1],
                 [1, 1, 1, 1, 1, 1, 1, 1],
                 [0, 0, 0, 0, 0, 0, 1, 1]], bool)

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
            attn_implementation="eager")
# kind -> (config class, model class, overrides): every case uses GQA (2 kv heads < 4 heads).
CASES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=False, rope_theta=1e6)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(tie_word_embeddings=True, head_dim=24)),  # head_dim != 64 / 4
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(tie_word_embeddings=True, rope_theta=5e5)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(tie_word_embeddings=False, sliding_window=None)),
}
SHARDED = {"qwen3"}  # Saved as model-0000x-of-0000y.safetensors + index.



def _message(err) -> str:
  """The error's sentence without load_hf_checkpoint's "model.path=<folder>: " prefix."""
  text = str(err.value)
  return text.split(": ", 1)[1] if text.startswith("model.path=") else text

def tiny_hf_model(kind, seed=0):
  """A random float32 transformers model whose norm weights and biases are not ones / zeros."""
  config_cls, model_cls, overrides = CASES[kind]
  torch.manual_seed(seed)
  model = model_cls(config_cls(**{**BASE, **overrides})).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
  return model


def save(model, path, sharded=False):
  model.save_pretrained(path, max_shard_size="20KB" if sharded else "1GB")
  return path


def assert_logits_close(ours, theirs):
  np.testing.assert_allclose(ours[MASK], theirs[MASK], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_loaded_checkpoint_matches_transformers(kind, tmp_path):
  model = tiny_hf_model(kind)
  save(model, tmp_path, sharded=kind in SHARDED)
  if kind in SHARDED:
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  reference = init_params(model_cfg, jax.random.key(0))
  assert jax.tree.structure(params) == jax.tree.structure(reference)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, reference)
  assert model_cfg.tie_embeddings == model.config.tie_word_embeddings
  assert model_cfg.num_kv_heads < model_cfg.num_heads
  assert_logits_close(decoder_logits(model_cfg, params, TOKENS, MASK),
                      transformers_logits(model, TOKENS, MASK))


@pytest.mark.parametrize("kind", sorted(CASES))
def test_export_round_trip(kind, tmp_path):
  model = tiny_hf_model(kind)
  model_cfg, params = hf.load_hf_checkpoint(save(model, tmp_path / "src"))
  out = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", model_type=kind)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(reloaded) is type(model)
  assert_logits_close(transformers_logits(reloaded, TOKENS, MASK),
                      transformers_logits(model, TOKENS, MASK))
  _, params_again = hf.load_hf_checkpoint(out)
  jax.tree.map(np.testing.assert_array_equal, params_again, params)


def test_export_from_source_dir_copies_config_and_tokenizer_files(tmp_path):
  model = tiny_hf_model("qwen2")
  source = save(model, tmp_path / "src")
  (source / "tokenizer_config.json").write_text('{"model_max_length": 8}')
  (source / "merges.txt").write_text("#version: 0.2\n")
  model_cfg, params = hf.load_hf_checkpoint(source)
  out = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", source_dir=source)
  for name in ("tokenizer_config.json", "merges.txt", "generation_config.json"):
    assert (out / name).read_text() == (source / name).read_text()
  assert not (out / "vocab.json").exists()
  assert json.loads((out / "config.json").read_text()) == {
      **json.loads((source / "config.json").read_text()), "dtype": "float32"}
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert_logits_close(transformers_logits(reloaded, TOKENS, MASK),
                      transformers_logits(model, TOKENS, MASK))


def test_export_rejects_source_dir_of_another_model(tmp_path):
  model_cfg, params = hf.load_hf_checkpoint(save(tiny_hf_model("qwen2"), tmp_path / "a"))
  other = save(tiny_hf_model("qwen3"), tmp_path / "b")
  with pytest.raises(ValueError) as err:
    hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", source_dir=other)
  assert _message(err) == (f"model_cfg.head_dim=16 but {other}/config.json implies 24; pass the "
                            f"source_dir the params were loaded from.")


def test_export_rejects_model_type_that_does_not_match_params(tmp_path):
  model_cfg, params = hf.load_hf_checkpoint(save(tiny_hf_model("qwen2"), tmp_path))
  with pytest.raises(ValueError) as err:
    hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", model_type="llama")
  assert _message(err) == (
      "model_type='llama' does not describe this model (family 'llama', qkv_bias=True, "
      "qk_norm=False, sliding_window=0); pass qwen2.")


def test_bfloat16_checkpoint_loads_and_exports(tmp_path):
  model = tiny_hf_model("qwen2").to(torch.bfloat16)
  save(model, tmp_path / "src")
  expected = {k: v.float().numpy() for k, v in model.state_dict().items()}
  model_cfg, params = hf.load_hf_checkpoint(tmp_path / "src")  # float32 params
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  k_proj = params["layers"]["self_attn"]["k_proj"]["kernel"][1]  # (embed, kv_heads, head_dim)
  np.testing.assert_array_equal(k_proj.reshape(k_proj.shape[0], -1),
                                expected["model.layers.1.self_attn.k_proj.weight"].T)
  np.testing.assert_array_equal(params["norm"]["weight"], expected["model.norm.weight"])
  _, bf16_params = hf.load_hf_checkpoint(tmp_path / "src", param_dtype="bfloat16")
  assert {x.dtype for x in jax.tree.leaves(bf16_params)} == {jnp.dtype(jnp.bfloat16)}
  out = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", dtype="bfloat16")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
  for name, tensor in reloaded.state_dict().items():
    assert tensor.dtype == torch.bfloat16, name
    np.testing.assert_array_equal(tensor.float().numpy(), expected[name], err_msg=name)


def test_model_config_from_older_config_files():
  old = dict(model_type="llama", vocab_size=10, hidden_size=32, intermediate_size=40,
             num_hidden_layers=1, num_attention_heads=4, rope_theta=250.0, rope_scaling=None,
             rms_norm_eps=1e-5, attention_bias=False)
  cfg = hf.model_config_from_hf(old, param_dtype="bfloat16")
  assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.rms_norm_eps) == (4, 8, 250.0, 1e-5)
  assert (cfg.tie_embeddings, cfg.qkv_bias, cfg.qk_norm, cfg.param_dtype) == (
      False, False, False, "bfloat16")
  qwen3 = hf.model_config_from_hf({**old, "model_type": "qwen3", "rope_scaling": {
      "type": "default"}})
  assert (qwen3.head_dim, qwen3.qk_norm, qwen3.qkv_bias) == (128, True, False)
  new = {**old, "model_type": "qwen2", "rope_parameters": {"rope_type": "default",
                                                           "rope_theta": 1e6}}
  assert hf.model_config_from_hf(new).rope_theta == 1e6
  assert hf.model_config_from_hf(new).qkv_bias


@pytest.mark.parametrize("change, message", [
    (dict(model_type="gpt2"), "config.json model_type='gpt2' is not supported; use a "
     "checkpoint of one of gemma2, gemma3_text, llama, mistral, qwen2, qwen3, qwen3_moe."),
    (dict(attention_bias=True), "config.json attention_bias=true puts a bias on o_proj, which "
     "the decoder does not have; only Qwen2-style q/k/v biases are supported."),
    (dict(use_sliding_window=True, sliding_window=4096), "config.json asks for sliding-window "
     "attention (sliding_window=4096), which model_type='llama' does not have in transformers; "
     "use a checkpoint with full attention."),
    (dict(hidden_size=None), "config.json has no 'hidden_size'; use the config.json that came "
     "with the checkpoint."),
])
def test_model_config_errors(change, message):
  base = dict(model_type="llama", vocab_size=10, hidden_size=32, intermediate_size=40,
              num_hidden_layers=1, num_attention_heads=4)
  with pytest.raises(ValueError) as err:
    hf.model_config_from_hf({**base, **change})
  assert _message(err) == message


def test_missing_directory_error(tmp_path):
  path = tmp_path / "nope"
  with pytest.raises(InputError) as err:
    hf.load_hf_checkpoint(path)
  assert _message(err) == (
      f"No checkpoint directory at {path}; download a Hugging Face checkpoint there first, "
      f"e.g. `hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir {path}`.")


def test_missing_config_error(tmp_path):
  with pytest.raises(InputError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err) == (
      f"{tmp_path} has no config.json; point at a full Hugging Face checkpoint directory, "
      f"e.g. one from `hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir {tmp_path}`.")


def test_missing_weights_error(tmp_path):
  tiny_hf_model("llama").config.save_pretrained(tmp_path)
  with pytest.raises(InputError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err) == (
      f"{tmp_path} has no model.safetensors or model.safetensors.index.json (.bin weights are "
      f"not read); download safetensors weights with "
      f"`hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir {tmp_path}`.")


def test_unknown_model_type_error(tmp_path):
  save(tiny_hf_model("llama"), tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gemma"}))
  with pytest.raises(ValueError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err) == ("config.json model_type='gemma' is not supported; use a checkpoint "
                            "of one of gemma2, gemma3_text, llama, mistral, qwen2, qwen3, "
                            "qwen3_moe.")


def _rewrite_weights(path, edit):
  from safetensors.numpy import load_file, save_file
  tensors = edit({k: np.array(v) for k, v in load_file(path / "model.safetensors").items()})
  save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_and_unexpected_tensor_errors(tmp_path):
  save(tiny_hf_model("llama"), tmp_path)
  name = "model.layers.1.mlp.up_proj.weight"
  _rewrite_weights(tmp_path, lambda t: {**t, "model.layers.0.self_attn.o_proj.bias":
                                        np.zeros(64, np.float32)})
  with pytest.raises(ValueError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err) == (
      "The checkpoint has tensors model.layers.0.self_attn.o_proj.bias that the decoder has no "
      "parameter for; only plain gemma2, gemma3_text, llama, mistral, qwen2, qwen3, qwen3_moe "
      "checkpoints are supported.")
  _rewrite_weights(tmp_path, lambda t: {k: v for k, v in t.items() if k != name})
  with pytest.raises(ValueError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err) == (
      f"The checkpoint lacks tensors {name} that its config.json implies; check that "
      f"config.json belongs to these weights.")


def test_wrong_shape_error(tmp_path):
  save(tiny_hf_model("llama"), tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 80}))
  with pytest.raises(ValueError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err) == (
      "Tensor model.layers.0.mlp.down_proj.weight has shape (64, 96) but config.json implies "
      "(64, 80); check that config.json belongs to these weights.")


def test_non_finite_weights_name_the_tensor(tmp_path):
  """A NaN in model.safetensors stops the load, naming the tensor, its file and the count."""
  from safetensors.numpy import load_file, save_file  # noqa: PLC0415
  save(tiny_hf_model("qwen2"), tmp_path)
  file = tmp_path / "model.safetensors"
  tensors = load_file(str(file))
  name = "model.layers.1.self_attn.k_proj.weight"
  tensors[name] = tensors[name].copy()
  tensors[name].flat[[3, 7]] = [np.nan, np.inf]
  save_file(tensors, str(file), metadata={"format": "pt"})
  with pytest.raises(ValueError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err) == (
      f"Tensor {name} in {file} has 2 non-finite value(s) (NaN or inf) of "
      f"{tensors[name].size}: the checkpoint is damaged; download or export it again.")


def test_bfloat16_sharded_export_loads_in_transformers(tmp_path):
  """train.export_dtype=bfloat16 with train.export_max_shard_mb: shards of at most that size
  and transformers' index; transformers loads them, logits within 1e-2 of float32's."""
  model = tiny_hf_model("qwen2")
  model_cfg, params = hf.load_hf_checkpoint(save(model, tmp_path / "src"))
  limit = 40_000  # bytes: the tiny model's ~0.2 MB in bfloat16 in several files
  out = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out", dtype="bfloat16",
                                       max_shard_bytes=limit, source_dir=tmp_path / "src")
  shards = sorted(out.glob("model-*-of-*.safetensors"))
  index = json.loads((out / "model.safetensors.index.json").read_text())
  assert len(shards) > 2 and not (out / "model.safetensors").exists()
  assert set(index["weight_map"].values()) == {s.name for s in shards}
  biggest = max(int(np.prod(p.shape)) * 2 for p in model.parameters())
  assert all(s.stat().st_size <= max(limit, biggest) + 4096 for s in shards)  # + header
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert {t.dtype for t in reloaded.state_dict().values()} == {torch.bfloat16}
  want = transformers_logits(model, TOKENS, MASK)[MASK]
  bf16_compute = np.abs(transformers_logits(reloaded, TOKENS, MASK)[MASK] - want).max()
  upcast = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  # the export's rounding alone
  gap = np.abs(transformers_logits(upcast, TOKENS, MASK)[MASK] - want).max()
  print(f"bfloat16 sharded export: {len(shards)} shards; max abs logit gap to float32 "
        f"{gap:.2e} (float32 compute), {bf16_compute:.2e} (bfloat16 compute); logits up to "
        f"{np.abs(want).max():.2f}")
  # The export is exact: every tensor is the float32 weight rounded to bfloat16, and the gap is
  # that rounding's (2^-8 relative): within 1e-2 of the largest logit, not 1e-2 absolute.
  expected = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
  for name, tensor in reloaded.state_dict().items():
    torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
  assert gap <= 1e-2 * np.abs(want).max()


def test_export_replaces_an_earlier_exports_weights_and_cleans_up_when_stopped(tmp_path):
  """A second export into the same folder leaves only its own weight files (a stale
  model.safetensors beside a new index would be loaded instead of it); an export stopped part
  way leaves no temporary shard and the earlier weights as they were."""
  from safetensors.numpy import load_file  # noqa: PLC0415
  arrays = [(f"w{i}", np.full((64,), i, np.float32)) for i in range(4)]  # 256 bytes each
  names = lambda: sorted(f.name for f in tmp_path.iterdir())  # noqa: E731
  hf_export.save_shards(iter(arrays), tmp_path, max_shard_bytes=512)
  assert names() == [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)] + [
      "model.safetensors.index.json"]
  hf_export.save_shards(iter(arrays), tmp_path, max_shard_bytes=0)
  assert names() == ["model.safetensors"]

  def stopped():
    yield from arrays[:3]
    raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    hf_export.save_shards(stopped(), tmp_path, max_shard_bytes=256)
  assert names() == ["model.safetensors"]
  assert sorted(load_file(str(tmp_path / "model.safetensors"))) == ["w0", "w1", "w2", "w3"]
  hf_export.save_shards(iter(arrays[:2]), tmp_path, max_shard_bytes=256)
  assert names() == [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)] + [
      "model.safetensors.index.json"]


def test_an_exports_tokenizer_files_are_its_sources_even_into_the_source_folder(tmp_path):
  """An earlier export's chat template does not outlive a re-export from a source without one;
  exporting into the folder the model came from keeps its tokenizer files."""
  model_cfg, params = hf.load_hf_checkpoint(save(tiny_hf_model("qwen2"), tmp_path / "src"))
  (tmp_path / "src" / "tokenizer_config.json").write_text('{"model_max_length": 8}')
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "chat_template.jinja").write_text("an earlier export's template")
  out = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out",
                                       source_dir=tmp_path / "src")
  assert not (out / "chat_template.jinja").exists()
  assert (out / "tokenizer_config.json").read_text() == '{"model_max_length": 8}'
  hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "src", source_dir=tmp_path / "src")
  assert (tmp_path / "src" / "tokenizer_config.json").read_text() == '{"model_max_length": 8}'
  assert_logits_close(decoder_logits(*hf.load_hf_checkpoint(tmp_path / "src"), TOKENS, MASK),
                      decoder_logits(model_cfg, params, TOKENS, MASK))


@pytest.mark.parametrize("index", ['{"weight_map": {"a": "b.safetensors"', '{"metadata": {}}',
                                   "[]", '{"weight_map": ["model.safetensors"]}'])
def test_a_damaged_shard_index_is_one_sentence(index, tmp_path):
  save(tiny_hf_model("qwen2"), tmp_path, sharded=True)
  (tmp_path / "model.safetensors.index.json").write_text(index)
  with pytest.raises(InputError) as err:
    hf.load_hf_checkpoint(tmp_path)
  assert _message(err).startswith(f"{tmp_path / 'model.safetensors.index.json'} is not a "
                                  f"safetensors index")
  assert _message(err).endswith("download or export the checkpoint again.")
