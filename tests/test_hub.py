"""Hub ids in model.path (grpo_jax/models/hub.py): a local folder is kept; offline or with the
Hub unreachable, one sentence naming the offline ways; a cached snapshot is used offline; the
command line fails in one line before anything is written."""

import os
import subprocess
import sys
import time

import ml_collections
import pytest

from grpo_jax.errors import InputError
from grpo_jax.main import cli
from grpo_jax.models import hub

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "grpo_tiny.py")


def _one_sentence(message: str) -> str:
  assert "\n" not in message and message.endswith(".") and message.count(". ") == 0, message
  return message


def test_local_paths_are_kept(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "ckpt" / "qwen").mkdir(parents=True)
  for path in ["", str(tmp_path), "ckpt/qwen", "runs/gsm8k/hf_export", "/no/such/folder"]:
    assert hub.resolve_model_path(path) == path
  assert hub.hub_id("Qwen/Qwen2.5-0.5B-Instruct@v1.0") == ("Qwen/Qwen2.5-0.5B-Instruct", "v1.0")
  assert hub.hub_id("ckpt/qwen") is None  # it exists here


def test_offline_is_one_sentence_naming_the_offline_ways(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(InputError) as err:
    hub.resolve_model_path("no-such-org/no-such-model@main")
  message = _one_sentence(str(err.value))
  assert "model.path='no-such-org/no-such-model@main'" in message
  assert "python -m grpo_jax.fetch_model smollm2-135m-instruct" in message
  assert "hf download no-such-org/no-such-model --local-dir DIR" in message


def test_an_unreachable_hub_fails_fast(monkeypatch):
  monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
  monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
  start = time.perf_counter()
  with pytest.raises(InputError) as err:
    hub.resolve_model_path("no-such-org/no-such-model")
  assert time.perf_counter() - start < 30
  assert "cannot be reached" in _one_sentence(str(err.value))
  assert "grpo_jax.fetch_model" in str(err.value)


def test_offline_a_cached_snapshot_is_used(tmp_path):
  """A snapshot in the Hugging Face cache layout (HF_HUB_CACHE, read at import: a subprocess)."""
  commit = "a" * 40
  repo = tmp_path / "cache" / "models--some-org--tiny"
  (repo / "refs").mkdir(parents=True)
  (repo / "refs" / "main").write_text(commit)
  (repo / "snapshots" / commit).mkdir(parents=True)
  (repo / "snapshots" / commit / "config.json").write_text("{}")
  env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
  code = "from grpo_jax.models.hub import resolve_model_path as r; print(r('some-org/tiny'))"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == str(repo / "snapshots" / commit)


def test_a_locked_config_gets_the_local_folder(monkeypatch, tmp_path):
  config = ml_collections.ConfigDict({"model": {"path": "some-org/tiny"}, "seed": 0})
  config.lock()
  monkeypatch.setattr(hub, "resolve_model_path", lambda path: str(tmp_path))
  hub.resolve_config_model_path(config)
  assert config.model.path == str(tmp_path)


def test_the_command_line_fails_in_one_line_before_the_workdir(capfd, tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  workdir = tmp_path / "run"
  code = cli([f"--config={TINY}", f"--workdir={workdir}",
              "--config.model.path=no-such-org/no-such-model"])
  lines = capfd.readouterr().err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and lines[0].startswith("error: model.path="), lines
  assert "grpo_jax.fetch_model" in lines[0] and not workdir.exists()
