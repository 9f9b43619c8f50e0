"""The README's runnable examples, run as written (with fewer steps) on fake devices."""

import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_8_device_example_runs_as_written(tmp_path):
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  block = re.search(r"# 8 local devices, FSDP x tensor parallel.*?\n(XLA_FLAGS=.*?)\n```", text,
                    re.S).group(1)
  words = shlex.split(block.replace("\\\n", " "))
  env = dict(os.environ, **dict(w.split("=", 1) for w in words if w.startswith("XLA_FLAGS=")))
  argv = [w for w in words if not w.startswith("XLA_FLAGS=")]
  assert argv[:3] == ["python", "-m", "grpo_jax.main"]
  workdir = tmp_path / "tiny8"
  argv = [sys.executable, *argv[1:]]
  argv = [f"--workdir={workdir}" if a.startswith("--workdir=") else a for a in argv]
  out = subprocess.run([*argv, "--config.warmup.steps=20", "--config.train.steps=2",
                        "--config.train.eval_every=2"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "mesh (data, fsdp, tensor, expert) = (2, 2, 2, 1) over 8 devices" in out.stdout
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1, 2] and "eval_accuracy" in records[-1]
