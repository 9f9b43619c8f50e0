"""benchmarks/accelerator_check.py --tiny: every part of the GPU check runs here at tiny shapes
on the CPU, cold and warm, so the script cannot rot between the sessions that have a GPU."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_tiny_check_runs_every_part_cold_and_warm(tmp_path):
  done = subprocess.run([sys.executable, "benchmarks/accelerator_check.py", "--tiny",
                         "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                        timeout=3000)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = (tmp_path / "accelerator_check.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in lines]
  status = {(r["part"], r["phase"]): r["status"] for r in records if "status" in r}
  assert status == {("env", "cold"): "ok", ("sampler", "cold"): "ok", ("update", "cold"): "ok",
                    ("gsm8k", "cold"): "ok", ("sampler", "warm"): "ok",
                    ("gsm8k", "warm"): "ok"}, records
  env = next(r for r in records if r["part"] == "env" and "backend" in r)
  assert env["backend"] == "cpu" and env["matmul_tflops"] > 0 and env["choices"]
  sampler = [r for r in records if r["part"] == "sampler" and "rows" in r]
  assert {(r["rows"], r["decode_loop"], r["phase"]) for r in sampler} == {
      (rows, loop, phase) for phase in ("cold", "warm")
      for rows, loop in ((4, "segments"), (8, "segments"), (8, "bounded"))}
  for r in sampler:  # one compiled program per sampler call, whatever the loop
    assert r["programs"] == 1 and r["decode_tokens_per_s"] > 0
  cold = {r["decode_loop"]: r["compile_s"] for r in sampler if r["rows"] == 8
          and r["phase"] == "cold"}
  warm = {r["decode_loop"]: r["compile_s"] for r in sampler if r["rows"] == 8
          and r["phase"] == "warm"}
  assert all(warm[loop] < cold[loop] for loop in cold)  # the persistent cache answered
  updates = [r for r in records if r["part"] == "update" and "mfu" in r]
  assert [r["attention_impl"] for r in updates] == ["xla", "jax"]  # the platform's, the other
  for update in updates:
    assert update["tokens_per_s"] > 0 and update["mfu"] > 0 and len(update["call_s"]) == 3
  for r in (r for r in records if r["part"] == "gsm8k" and "exit" in r):
    assert r["exit"] == 0 and r["first_step"] and r["steady_step"]
    assert r["programs"]["rl_step"]["compiles"] == 1
  assert records[-1]["part"] == "summary"


def test_a_part_past_its_limit_is_stopped_and_reported():
  import types
  sys.path.insert(0, ROOT)
  from benchmarks.accelerator_check import run_part
  args = types.SimpleNamespace(workdir=ROOT, tiny=True)
  records = run_part("sampler", "cold", args, dict(os.environ, JAX_PLATFORMS="cpu"), 0.5, {})
  assert records == [dict(part="sampler", phase="cold", status="stopped at its 0.5 s limit",
                          wall_s=records[0]["wall_s"], stderr_tail=records[0]["stderr_tail"])]
