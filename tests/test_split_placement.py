"""Split placement (mesh.rollout_devices): the checks that refuse a split before any compute,
and the tiny GRPO recipe run end to end with the sampler on devices 4-7 of 8 fake CPU devices
and the learner on 0-3 (a subprocess running this file's `_worker`)."""

import json
import os
import subprocess
import sys
import types

import pytest

from grpo_jax import config as config_lib
from grpo_jax.errors import ConfigError
from grpo_jax.parallel.mesh import mesh_config, role_meshes
from grpo_jax.train.sources.experience_source import SourceSettings
from grpo_jax.train.stages import rl as _registers_sources  # noqa: F401
from grpo_jax.train.stages import rl_checks
from tests.fixtures import small_tiny_config, xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh(data):
  return types.SimpleNamespace(shape={"data": data, "fsdp": 1, "tensor": 1, "expert": 1})


def test_a_split_must_leave_both_roles_devices():
  with pytest.raises(ValueError, match=r"^mesh.rollout_devices=1 cannot be carved from 1 "
                                       r"device; use 0 \(one shared mesh\) \(split placement "
                                       r"needs at least 2 devices"):
    role_meshes(mesh_config(-1), 1)
  learner, sampler = role_meshes(mesh_config(-1), 0)
  assert sampler is None and learner.size == 1


def test_a_negative_split_is_refused_by_validation():
  config = small_tiny_config()
  config.mesh.rollout_devices = -2
  with pytest.raises(ConfigError, match=r"^mesh.rollout_devices=-2; use 0"):
    config_lib.validate(config)


def test_what_cannot_run_on_a_split_is_refused():
  t = small_tiny_config().train
  rl_checks.check_split_placement(0, t, True, 2)  # no split: nothing to refuse
  t.experience_source = "fused"
  with pytest.raises(ConfigError, match=r"^mesh.rollout_devices=4 puts the sampler on devices "
                                        r"of its own, but train.experience_source='fused'"):
    rl_checks.check_split_placement(4, t, False, 1)
  t.experience_source = "host"
  with pytest.raises(ConfigError, match=r"^mesh.rollout_devices=4: stacked seeds"):
    rl_checks.check_split_placement(4, t, True, 1)
  with pytest.raises(ConfigError, match=r"^mesh.rollout_devices=4 with 2 processes"):
    rl_checks.check_split_placement(4, t, False, 2)


def test_the_sampled_batch_must_split_over_the_samplers_mesh():
  config = small_tiny_config()  # 4 prompts x 4 completions
  settings = SourceSettings.of(config)
  rl_checks.check_batches_fit_sampler(config.rl, settings, _mesh(8))
  with pytest.raises(ConfigError, match=r"^the rollout batch \(rollout.num_prompts=4 x "
                                        r"rollout.group_size=4\) = 16 does not split over the "
                                        r"3 devices of the sampler's mesh"):
    rl_checks.check_batches_fit_sampler(config.rl, settings, _mesh(3))


# The tiny GRPO recipe at seconds' size: 5 warm-up steps, 4 prompts x 4 completions, 3 steps.
SMALL = {"warmup.steps": 5, "warmup.batch_size": 32, "train.steps": 3, "train.eval_every": 3,
         "train.eval_size": 8, "train.eval_batch_size": 8, "rollout.num_prompts": 4,
         "rollout.group_size": 4, "train.num_samples": 0, "train.checkpoint_every": 0}


def _split_run(tmp_path, overrides: dict) -> dict:
  env = xla_env(8, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "tests/test_split_placement.py", str(tmp_path / "run"),
                        json.dumps({"mesh.rollout_devices": 4, **overrides})], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_tiny_recipe_runs_split_four_and_four(tmp_path):
  """mesh.rollout_devices=4 of 8: the learner's params on devices 0-3, every sync's copy (what
  the sampler samples with) on 4-7, each sync moving the params' 1,583,616 bytes."""
  got = _split_run(tmp_path, SMALL)
  assert got["learner"] == [0, 1, 2, 3] and got["sampler"] == [4, 5, 6, 7]
  # 4 syncs: the warm-up check's draw of the first batch (grpo_jax/train/run/no_signal.py),
  # then one a step
  assert [s["weight_sync_bytes"] for s in got["syncs"]] == [1_583_616] * 4
  assert all(s["weight_sync_s"] > 0 for s in got["syncs"])
  steps = [r for r in got["records"] if "reward_mean" in r]
  assert [r["step"] for r in steps] == [1, 2, 3]
  # The sampler's log-probs (devices 4-7) are the learner's recomputed ones (0-3) to rounding:
  # it sampled with the learner's weights of that step (measured 7e-8 .. 9e-8).
  assert all(r["sampler_logprob_gap"] < 1e-5 for r in steps)


@pytest.mark.long  # 142 s in CI (2026-12-05); `pytest -m long` runs it
def test_the_tiny_recipe_learns_split_four_and_four(tmp_path):
  """The recipe's own warm-up (1000 steps), then 30 GRPO steps with the sampler on devices 4-7:
  held-out accuracy 0.275 -> 0.660 measured (8 fake CPU devices, 2026-11-27; 5m23s on a loaded
  2-core machine), asserted with margin."""
  got = _split_run(tmp_path, {"train.steps": 30, "train.eval_every": 30, "train.eval_size": 200,
                              "train.eval_batch_size": 100, "train.num_samples": 0,
                              "train.checkpoint_every": 0})
  assert got["sampler"] == [4, 5, 6, 7]
  evals = [r["eval_accuracy"] for r in got["records"] if "eval_accuracy" in r]
  assert evals[0] > 0.15 and evals[-1] > max(0.45, evals[0] + 0.15), evals


def _worker(workdir: str, overrides: str) -> None:
  """Runs the tiny GRPO recipe (configs/grpo_tiny.py with `overrides`, a JSON object of dotted
  fields) in this process and prints one JSON line: the devices of the learner's params and of
  every weight sync's copy, each sync's weight_sync_bytes / weight_sync_s, and the metrics."""
  import jax  # noqa: PLC0415

  from configs import grpo_tiny  # noqa: PLC0415
  from grpo_jax.train.sources.experience_source import Run  # noqa: PLC0415
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415

  ids = lambda tree: sorted({d.id for x in jax.tree.leaves(tree)  # noqa: E731
                             for d in x.sharding.device_set})
  synced_on, syncs, plain = set(), [], Run.sync_weights

  def timed(self, params):  # the source's sync, through sync_weights_timed, recorded
    Run.sync_weights = plain
    try:
      synced, timing = self.sync_weights_timed(params)
    finally:
      Run.sync_weights = timed
    synced_on.update(ids(synced))
    syncs.append(timing)
    return synced

  Run.sync_weights = timed
  config = grpo_tiny.get_config()
  for field, value in json.loads(overrides).items():
    *parents, name = field.split(".")
    section = config
    for p in parents:
      section = section[p]
    section[name] = value
  state = train(config, workdir, log=lambda *a, **k: None)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  print(json.dumps(dict(learner=ids(state.train.params), sampler=sorted(synced_on),
                        syncs=syncs, records=records)))


if __name__ == "__main__":
  _worker(sys.argv[1], sys.argv[2])
