"""A gs:// workdir, offline: every file a run writes under its workdir goes through
grpo_jax/train/run/files.py (etils.epath), so a training run and its resume work on a bucket. The
bucket is fsspec's in-memory file system registered for gs:// (what gcsfs serves online).
Checkpoints are orbax's, which writes gs:// through tensorstore's own GCS driver, unreachable
offline: here they go to a local folder."""

import json
import os

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from grpo_jax.main import cli
from grpo_jax.train.run import checkpoint

from grpo_jax.train.run import files
from grpo_jax.train.stages import rl as loop
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config=configs/grpo_tiny.py", "--config.warmup.steps=20", "--config.train.eval_every=2",
        "--config.train.eval_size=8", "--config.train.eval_batch_size=8",
        "--config.rollout.num_prompts=4", "--config.rollout.group_size=2",
        "--config.train.checkpoint_every=2", "--config.train.num_samples=2"]


class FakeBucket(MemoryFileSystem):
  """gs:// in memory: what gcsfs would do, without a network."""
  protocol = ("gs", "gcs")
  store, pseudo_dirs = {}, [""]

  def __init__(self, *args, **kwargs):  # gcsfs' options (finalize_on_close=...)
    super().__init__()

  def open(self, path, mode="rb", **kwargs):
    if "a" in mode:  # objects cannot be appended to: files.append must rewrite them
      raise NotImplementedError("gs:// objects cannot be appended to")
    return super().open(path, mode, **kwargs)


@pytest.fixture
def bucket(monkeypatch, tmp_path):
  for name in ("gs", "gcs"):
    fsspec.register_implementation(name, FakeBucket, clobber=True)
  FakeBucket.store.clear()
  from etils.epath import backend
  backend.fsspec_backend._get_filesystem.cache_clear()
  local = tmp_path / "checkpoints"
  monkeypatch.setattr(loop, "Checkpoints", lambda directory, *a, **k: checkpoint.Checkpoints(
      str(local / os.path.basename(directory)), *a, **k))
  monkeypatch.chdir(ROOT)
  yield FakeBucket()
  backend.fsspec_backend._get_filesystem.cache_clear()


def _records(path):
  return [json.loads(line) for line in files.read_text(path).splitlines()]


def test_a_gs_workdir_trains_and_resumes(bucket, tmp_path, capfd):
  workdir = "gs://bucket/runs/tiny"
  assert cli([f"--workdir={workdir}", *TINY, "--config.train.steps=2"]) == 0
  out = capfd.readouterr().out
  # tensorboardX writes gs:// itself with google-cloud-storage, which the test extra lacks
  assert f"warning: no TensorBoard events in {workdir} (ImportError: `google-cloud-storage`" in out
  assert all(p.startswith(f"{workdir}/") for p in bucket.store)
  written = sorted(p.rpartition("/")[2] for p in bucket.store)
  assert written == [".lock", "config.json", "curves.png", "metrics.jsonl", "run_info.json",
                     "samples.jsonl"]
  assert [r["step"] for r in _records(f"{workdir}/metrics.jsonl")] == [0, 1, 2]
  assert not os.path.exists(os.path.join(ROOT, "gs:"))  # nothing went to a local "gs:" folder
  # The resume reads config.json and run_info.json from the bucket and keeps its records.
  assert cli([f"--workdir={workdir}", *TINY, "--config.train.steps=3"]) == 0
  metrics = _records(f"{workdir}/metrics.jsonl")
  assert [r["step"] for r in metrics] == [0, 1, 2, 3]
  starts = json.loads(files.read_text(f"{workdir}/run_info.json"))["starts"]
  assert [s["resumed_from_step"] for s in starts] == [None, 2]
  assert {r["step"] for r in _records(f"{workdir}/samples.jsonl")} == {0, 2, 3}
  assert sorted(os.listdir(tmp_path / "checkpoints" / "checkpoints")) == ["0", "2", "3"]


def test_folders_written_locally_are_uploaded(bucket):
  """The exports (safetensors writes local files only) are written to a temporary folder and
  uploaded, byte for byte; a local target is written in place."""
  with files.local_folder("gs://bucket/run/hf_export") as folder:
    assert not folder.startswith("gs:")
    os.makedirs(os.path.join(folder, "sub"))
    for name, data in (("model.safetensors", b"\x00\x01weights"), ("sub/config.json", b"{}")):
      with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
  assert not os.path.exists(folder)
  assert files.path("gs://bucket/run/hf_export/model.safetensors").read_bytes() == b"\x00\x01weights"
  assert files.read_text("gs://bucket/run/hf_export/sub/config.json") == "{}"
  files.append("gs://bucket/run/log.jsonl", "a\n")
  files.append("gs://bucket/run/log.jsonl", "b\n")  # no append on objects: rewritten
  assert files.read_text("gs://bucket/run/log.jsonl") == "a\nb\n"
  with files.local_folder("/tmp/some/where") as folder:
    assert folder == "/tmp/some/where"


def test_an_upload_replaces_the_folders_earlier_files(bucket):
  """A second export to the same gs:// folder leaves only its own files: an earlier export's
  model.safetensors beside a new sharded index would be what transformers loads."""
  out = "gs://bucket/run/hf_export"
  for names in (["model.safetensors", "a.json"], ["model-00001-of-00001.safetensors",
                                                  "model.safetensors.index.json"]):
    with files.local_folder(out) as folder:
      for name in names:
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "wb") as f:
          f.write(name.encode())
  assert sorted(p.rpartition("hf_export/")[2] for p in bucket.store) == sorted(names)
  assert files.read_text(f"{out}/model.safetensors.index.json") == "model.safetensors.index.json"
