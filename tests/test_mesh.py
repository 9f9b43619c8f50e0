"""Sharded rollout and update on 8 CPU devices equal the single-device run; mesh errors."""

import json
import os
import subprocess
import sys

import pytest

from grpo_jax.parallel.mesh import mesh_config, resolve_mesh_shape
from tests.fixtures import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def mesh_results():
  env = xla_env(8, PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "tests/mesh_worker.py"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


CACHE_SHARD = {"(8, 1, 1)": [2, 2, 9, 8], "(2, 4, 1)": [2, 2, 9, 8], "(2, 2, 2)": [4, 1, 9, 8],
               "(1, 2, 4)": [8, 2, 9, 8]}


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["(8, 1, 1)", "(2, 4, 1)", "(2, 2, 2)", "(1, 2, 4)"])
def test_sharded_run_equals_single_device(mesh_results, shape):
  r = mesh_results[shape]
  assert r["greedy_equal"], "greedy tokens differ from the single-device run"
  assert r["sampled_equal"], "sampled tokens (same key) differ from the single-device run"
  assert r["params_moved"] > 1e-3  # two real updates happened
  assert r["params_max_diff"] <= 1e-5
  if shape in ("(2, 2, 2)", "(1, 2, 4)"):
    assert r["accum_params_max_diff"] <= 1e-5  # 4 micro-batches == the full batch
  assert r["loss"] == pytest.approx(r["ref_loss"], abs=1e-5)
  if shape == "(2, 2, 2)":  # each prompt run once for its rows (rl.shared_prompt_forward)
    assert r["shared_params_max_diff"] <= 1e-5
    assert r["shared_loss"] == pytest.approx(r["shared_ref_loss"], abs=1e-5)
  # KV cache (B=16, kv_heads=2, S=3+6, D=8): rows over data x fsdp, kv heads over tensor when
  # it divides 2 (tensor=4 does not: replicated).
  assert r["cache_shard"] == CACHE_SHARD[shape]


@pytest.mark.parametrize("sizes,devices,message", [
    ((2, 2, 1), 8,
     "mesh (data, fsdp, tensor, expert, context) = (2, 2, 1, 1, 1) has 4 devices but 8 are "
     "present"),
    ((3, -1, 1), 8, "cannot fill 8 devices: 8 is not a multiple of 3"),
    ((-1, -1, 1), 8, "at most one -1"),
])
def test_mesh_errors_name_the_numbers(sizes, devices, message):
  cfg = mesh_config(*sizes)
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    resolve_mesh_shape(cfg, devices)


def test_mesh_shape_fills_the_rest():
  assert resolve_mesh_shape(mesh_config(-1, 2, 2), 8) == (2, 2, 2, 1, 1)
  assert resolve_mesh_shape(mesh_config(1, 2, 1, -1), 8) == (1, 2, 1, 4, 1)
  assert resolve_mesh_shape(mesh_config(2, 1, 1, 1, -1), 8) == (2, 1, 1, 1, 4)
