"""Meshes by role: the learner and the sampler on separate halves of 8 fake CPU devices; the
weight sync (Run.sync_weights) gives the sampler the learner's params, value for value, on its
own devices, and the sampler samples from them what it samples from the host copy."""

import json
import os
import subprocess
import sys

from tests.fixtures import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_sampler_mesh_gets_the_learners_params():
  env = xla_env(8, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "tests/role_mesh_worker.py"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got["learner_devices"] == [0, 1, 2, 3]
  assert got["sampler_devices"] == got["rollout_devices"] == [4, 5, 6, 7]
  assert got["equal"] and got["same_mesh_is_identity"] and got["tokens_equal"]
  # mesh.rollout_devices=4 of 8: the first four the learner's, the last four the sampler's,
  # each by the same rules (data=-1: 4); the timed sync moves every byte of the params.
  assert got["carved_learner"] == [0, 1, 2, 3] and got["carved_sampler"] == [4, 5, 6, 7]
  assert got["carved_shapes"] == [[4, 1, 1, 1, 1], [4, 1, 1, 1, 1]] and got["shared_alone"]
  assert got["sync_bytes"] == got["params_bytes"] > 0 and got["sync_s"] > 0
  assert got["shared_timing"] == {"weight_sync_bytes": 0, "weight_sync_s": 0.0}
