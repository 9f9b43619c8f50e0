"""Two processes x 2 CPU devices (gloo, localhost) run 2 GRPO steps of the tiny config: their
metrics equal a 1-process x 4-device run: the same tokens, rewards and lengths (bit for bit)
and float metrics within 1e-5 relative, since a cross-process (gloo) all-reduce may add the
devices' partial sums in another order than the in-process one (measured: two batch means
1 ulp apart at step 2; with rl.max_staleness=1 on an AMD EPYC, 2026-12-05, up to 2e-6 by step
3 as the rounding carries through the stale updates)."""

import json
import os
import subprocess
import sys

import pytest

from grpo_jax.train.run.metrics import TIMING_KEYS
from tests.fixtures import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# No warm-up (fast); the soft overlong penalty gives a random policy varied rewards, so the
# two steps make real updates.
SMALL = ["--config=configs/grpo_tiny.py", "--config.warmup.steps=0", "--config.train.steps=2",
         "--config.train.eval_every=1", "--config.train.eval_size=16",
         "--config.train.eval_batch_size=8", "--config.rollout.num_prompts=4",
         "--config.rollout.group_size=4", "--config.rl.num_iterations=2",
         "--config.rl.num_minibatches=2", "--config.rl.overlong_buffer=2",
         "--config.rl.kl_coef=0.05", "--config.optim.learning_rate=0.01",
         "--config.optim.warmup_steps=1", "--config.train.checkpoint_every=0"]


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in f]


def _compare(multi_metrics, single_metrics):
  """Bit for bit but the float metrics, within 1e-5 relative (see the module docstring)."""
  assert [sorted(r) for r in multi_metrics] == [sorted(r) for r in single_metrics]
  bad = []
  for multi_row, single_row in zip(multi_metrics, single_metrics):
    for key, value in multi_row.items():
      if key == "sampler_logprob_gap":  # itself a rounding measure (~1e-7): absolute bar
        if value != pytest.approx(single_row[key], abs=1e-6):
          bad.append((multi_row["step"], key, value, single_row[key]))
      elif isinstance(value, float) and not float(value).is_integer():
        if value != pytest.approx(single_row[key], rel=1e-5, abs=1e-9):
          bad.append((multi_row["step"], key, value, single_row[key]))
      elif value != single_row[key]:
        bad.append((multi_row["step"], key, value, single_row[key]))
  assert not bad, bad


def _both(tmp_path, *extra, port_offset=0):
  """(2 processes x 2 devices, 1 process x 4 devices) runs of SMALL + extra: their metrics."""
  env = dict(os.environ)  # the session's XLA flags; launch/local_multihost.sh adds the devices
  env["JAX_PORT"] = str(23000 + os.getpid() % 5000 + port_offset)
  multi = subprocess.run(["bash", "launch/local_multihost.sh", "2", "2", *SMALL, *extra,
                          f"--workdir={tmp_path / 'multi'}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
  assert multi.returncode == 0, multi.stderr[-3000:]
  assert "2 process(es)" in multi.stdout
  single = subprocess.run([sys.executable, "-m", "grpo_jax.main", *SMALL, *extra,
                           f"--workdir={tmp_path / 'single'}"], cwd=ROOT,
                          env=xla_env(4, JAX_PORT=env["JAX_PORT"]),
                          capture_output=True, text=True, timeout=900)
  assert single.returncode == 0, single.stderr[-3000:]
  assert "(4, 1, 1, 1, 1) over 4 devices, 1 process(es)" in single.stdout
  return env, _metrics(tmp_path / "multi"), _metrics(tmp_path / "single")


@pytest.mark.slow
def test_asynchronous_two_processes_equal_one_process(tmp_path):
  """rl.max_staleness=1 (train/sources/pipeline.py): every process serves the same device calls
  in the same order, so 2 processes give the 1-process run's metrics, with stale rows."""
  _, multi_metrics, single_metrics = _both(tmp_path, "--config.rl.max_staleness=1",
                                           "--config.train.steps=3", port_offset=7)
  assert [r.get("experience_staleness") for r in multi_metrics] == [None, 0, 1, 1]
  _compare(multi_metrics, single_metrics)


@pytest.mark.slow
def test_two_processes_equal_one_process_with_as_many_devices(tmp_path):
  env, multi_metrics, single_metrics = _both(tmp_path)
  assert [r["step"] for r in multi_metrics] == [0, 1, 2]
  _compare(multi_metrics, single_metrics)
  assert multi_metrics[2]["grad_norm"] > 0.1 and multi_metrics[2]["kl"] > 0  # it trained
  # Process 0 alone reads the record: its refusal (a damaged config.json) stops every process
  # in one sentence each, instead of the others waiting at the restore.
  (tmp_path / "multi" / "config.json").write_text("{cut")
  refused = subprocess.run(["bash", "launch/local_multihost.sh", "2", "2", *SMALL,
                            "--config.train.steps=3", f"--workdir={tmp_path / 'multi'}"],
                           cwd=ROOT, env=dict(env, JAX_PORT=str(int(env["JAX_PORT"]) + 1)),
                           capture_output=True, text=True, timeout=300)
  lines = sorted(refused.stderr.strip().splitlines())
  assert refused.returncode == 2 and len(lines) == 2, refused.stderr[-3000:]
  assert lines[0].startswith(f"error: {tmp_path / 'multi'}/config.json is damaged")
  assert lines[1].startswith("error: process 0 refused to resume this workdir")


@pytest.mark.parametrize("name", ["JAX_NUM_PROCESSES", "JAX_PROCESS_ID"])
def test_an_explicit_start_with_a_variable_that_is_not_a_number_is_one_sentence(
    name, monkeypatch):
  from ml_collections import ConfigDict  # noqa: PLC0415

  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from grpo_jax.parallel import distributed  # noqa: PLC0415
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "0")
  monkeypatch.setenv(name, "two")
  cfg = ConfigDict(dict(mode="explicit", coordinator_address="127.0.0.1:1", num_processes=0,
                        process_id=-1))
  with pytest.raises(ConfigError, match=rf"^{name}='two' is not a whole number; export {name}"):
    distributed.initialize(cfg)
