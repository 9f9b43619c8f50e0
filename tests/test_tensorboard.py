"""TensorBoard events: a run's scalars and texts reach the event file under their dashboard
tags, and writing them never imports torch (tensorboardX's writer module would, when torch is
installed: 1.7 s of every run's start on the 2-core CI machine)."""

import glob
import json
import os
import struct
import subprocess
import sys

import pytest

pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITE = """
import importlib.util, json, sys
from grpo_jax.train.run.metrics import MetricsWriter
writer = MetricsWriter(sys.argv[1], 2, stream=None)
writer.write(0, {"eval_accuracy": 0.5})
writer.write(1, {"reward_mean": 0.25, "loss": -1.5, "tokens_per_s": 10.0})
writer.write_text(1, "samples", "12+30=42")
writer.close()
held = "torch" in sys.modules
if importlib.util.find_spec("torch") is not None:
  import torch  # importable afterwards: the hold is lifted
print(json.dumps({"torch_imported": held}))
"""


def _events(path):
  """The Event protos of a TFRecord file (length, its CRC, the data, its CRC)."""
  with open(path, "rb") as f:
    data = f.read()
  events, at = [], 0
  while at < len(data):
    (length,) = struct.unpack("<Q", data[at:at + 8])
    events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
    at += 12 + length + 4
  return events


def test_scalars_and_texts_reach_the_event_file_without_torch(tmp_path):
  out = subprocess.run([sys.executable, "-c", WRITE, str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout.splitlines()[-1]) == {"torch_imported": False}
  (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
  scalars, texts = {}, {}
  for event in _events(path):
    for value in event.summary.value:
      if value.HasField("simple_value"):
        scalars[(value.tag, event.step)] = value.simple_value
      elif value.HasField("tensor"):
        texts[(value.tag.split("/")[0], event.step)] = value.tensor.string_val[0].decode()
  assert scalars == {("eval/accuracy", 0): 0.5, ("reward/mean", 1): 0.25,
                     ("train/loss", 1): -1.5, ("time/tokens_per_s", 1): 10.0}
  assert texts == {("samples", 1): "12+30=42"}
