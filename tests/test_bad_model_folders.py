"""Bad model folders as a new user gives them (tests/test_bad_inputs.py's GSM8K run and its
checks): a missing or damaged folder, config.json, weights, shards or tokenizer. Each must end
with exit status 2, exactly one line on stderr naming the offending file or value, and nothing
written to the workdir; the standalone evaluation (grpo_jax.eval) takes the same error path."""

import json
import os
import shutil

import numpy as np
import pytest

from tests.test_bad_inputs import (EXCERPT, GSM8K, GSM8K_SMALL, _copy, _expect, _gsm8k,
                                   _write_lines)
from tests.test_bad_inputs import checkpoint  # noqa: F401  the fixture: a tiny Qwen2 folder


def _edit_config(folder, **changes):
  config = json.loads((folder / "config.json").read_text())
  config.update(changes)
  (folder / "config.json").write_text(json.dumps(config))


def _damage(folder, case):
  """Damages a copy of the checkpoint; returns what the error line must name."""
  weights = folder / "model.safetensors"
  if case == "missing_folder":
    shutil.rmtree(folder)
    return ("model.path=", "is not a directory")
  if case == "file_not_folder":
    shutil.rmtree(folder)
    folder.write_text("weights")
    return (str(folder), "is not a directory")
  if case == "no_config":
    os.remove(folder / "config.json")
    return (str(folder), "has no config.json")
  if case == "config_not_json":
    (folder / "config.json").write_text("{\"model_type\": \"qwen2\",")
    return (str(folder / "config.json"), "is not valid JSON")
  if case == "config_no_hidden_size":
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"]
    (folder / "config.json").write_text(json.dumps(config))
    return (str(folder), "'hidden_size'")
  if case == "config_gelu":
    _edit_config(folder, hidden_act="gelu")
    return (str(folder), "hidden_act='gelu'")
  if case == "config_model_type":
    _edit_config(folder, model_type="gemma")
    return (str(folder), "model_type='gemma'")
  if case == "config_zero_heads":
    _edit_config(folder, num_attention_heads=0)
    return (str(folder), "num_attention_heads=0")
  if case == "config_wrong_size":
    _edit_config(folder, intermediate_size=96)
    return (str(folder), "shape")
  if case == "no_weights":
    os.remove(weights)
    return (str(folder), "has no model.safetensors")
  if case == "truncated_weights":
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2])
    return (str(weights), "truncated or damaged")
  if case == "garbage_weights":
    weights.write_bytes(b"\x00" * 64)
    return (str(weights), "cannot be read as safetensors")
  if case in ("nan_weights", "missing_tensor"):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(weights))
    name = "model.layers.1.mlp.up_proj.weight"
    if case == "nan_weights":
      tensors[name] = np.full_like(tensors[name], np.nan)
      needles = (name, "non-finite")
    else:
      del tensors[name]
      needles = (name, "lacks tensors")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return (str(folder), *needles)
  if case == "missing_shard":
    from safetensors import safe_open
    with safe_open(str(weights), framework="np") as f:
      names = list(f.keys())
    os.rename(weights, folder / "shard-1.safetensors")
    weight_map = {name: "shard-1.safetensors" for name in names}
    weight_map["model.norm.weight"] = "shard-2.safetensors"
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return (str(folder), "shard-2.safetensors", "missing")
  if case == "no_tokenizer":
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja"):
      if (folder / name).exists():
        os.remove(folder / name)
    return (f"model.path={folder}", "tokenizer")
  if case == "tokenizer_not_json":
    (folder / "tokenizer.json").write_text("{\"version\": ")
    return (f"model.path={folder}", "tokenizer")
  if case == "small_max_positions":
    _edit_config(folder, max_position_embeddings=100)
    return ("max_position_embeddings=100",)
  raise AssertionError(case)


MODEL_CASES = ["missing_folder", "file_not_folder", "no_config", "config_not_json",
               "config_no_hidden_size", "config_gelu", "config_model_type", "config_zero_heads",
               "config_wrong_size", "no_weights", "truncated_weights", "garbage_weights",
               "nan_weights", "missing_tensor", "missing_shard", "no_tokenizer",
               "tokenizer_not_json", "small_max_positions"]


@pytest.mark.parametrize("case", MODEL_CASES)
def test_a_bad_model_folder_names_the_file(capfd, tmp_path, checkpoint, case):
  folder = _copy(checkpoint, tmp_path, "model")
  needles = _damage(folder, case)
  _gsm8k(capfd, tmp_path, *needles, model=folder)


@pytest.mark.parametrize("case", ["no_tokenizer", "empty_test"])
def test_the_standalone_evaluation_takes_the_same_error_path(capfd, tmp_path, checkpoint, case):
  """grpo_jax.eval used to report 0.0 and exit 0 on a folder without tokenizer files."""
  from grpo_jax import eval as evaluation
  folder, data = _copy(checkpoint, tmp_path, "model"), _copy(EXCERPT, tmp_path, "data")
  needles = (_damage(folder, case) if case == "no_tokenizer" else
             (str(_write_lines(data, "test", [])), "holds no records"))
  argv = [f"--config={GSM8K}", f"--config.model.path={folder}", f"--config.data.path={data}",
          *GSM8K_SMALL]
  _expect(capfd, argv, str(tmp_path / "eval"), *needles, entry=evaluation.main)
