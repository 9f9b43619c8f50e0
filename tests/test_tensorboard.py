"""TensorBoard events: a run's scalars and texts reach the event file under their dashboard
tags, and writing them never imports torch (tensorboardX's writer module would, when torch is
installed: 1.7 s of every run's start on the 2-core CI machine)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Run in a child process: the pytest worker may hold torch already (the parity tests import it).
WRITE_AND_READ = """
import glob, importlib.util, json, struct, sys
from grpo_jax.train.run.metrics import MetricsWriter
writer = MetricsWriter(sys.argv[1], 2, stream=None)
writer.write(0, {"eval_accuracy": 0.5})
writer.write(1, {"reward_mean": 0.25, "loss": -1.5, "tokens_per_s": 10.0})
writer.write_text(1, "samples", "12+30=42")
writer.close()
torch_imported = "torch" in sys.modules
if importlib.util.find_spec("torch") is not None:
  import torch  # importable afterwards: the hold is lifted
from tensorboardX.proto import event_pb2
(path,) = glob.glob(sys.argv[1] + "/events.out.tfevents.*")
data, at, scalars, texts = open(path, "rb").read(), 0, [], []
while at < len(data):  # TFRecords: length, its CRC, the Event, its CRC
  (length,) = struct.unpack("<Q", data[at:at + 8])
  event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
  at += 12 + length + 4
  for value in event.summary.value:
    if value.HasField("simple_value"):
      scalars.append([value.tag, event.step, value.simple_value])
    elif value.HasField("tensor"):
      texts.append([value.tag.split("/")[0], event.step, value.tensor.string_val[0].decode()])
print(json.dumps({"torch_imported": torch_imported, "scalars": scalars, "texts": texts}))
"""


@pytest.mark.skipif(importlib.util.find_spec("tensorboardX") is None,
                    reason="tensorboardX is not installed (it is optional)")
def test_scalars_and_texts_reach_the_event_file_without_torch(tmp_path):
  out = subprocess.run([sys.executable, "-c", WRITE_AND_READ, str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.splitlines()[-1])
  assert got["torch_imported"] is False
  assert sorted(map(tuple, got["scalars"])) == [
      ("eval/accuracy", 0, 0.5), ("reward/mean", 1, 0.25), ("time/tokens_per_s", 1, 10.0),
      ("train/loss", 1, -1.5)]
  assert got["texts"] == [["samples", 1, "12+30=42"]]
