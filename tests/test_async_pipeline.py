"""Asynchronous RL with bounded staleness (rl.max_staleness; train/sources/pipeline.py): the
schedule is a function of the step numbers alone, so a run at max_staleness=1 repeats bit for
bit with rewards that take random times, and killed mid-pipeline and resumed it gives the
uninterrupted run's records and checkpoint."""

import random
import signal
import threading
import time

import numpy as np
import pytest

from grpo_jax.config import ConfigError
from grpo_jax.train.sources.pipeline import (Producer, Schedule, behaviour_version,
                                             check_pipeline, initial_in_flight, shift)
from tests.tiny_runs import assert_trees_equal, raw_state, records, run, start_and_signal, strip

ASYNC = ["--config.rl.max_staleness=1", "--config.imports=tests/async_reward.py",
         "--config.reward.name=exact_match_after_a_random_wait"]


def test_the_behaviour_version_is_the_step_minus_k_from_zero():
  assert [behaviour_version(t, 2) for t in range(5)] == [0, 0, 0, 1, 2]
  assert [behaviour_version(t, 0) for t in range(3)] == [0, 1, 2]


def test_in_flight_holds_k_versions_and_shifts_the_newest_in():
  assert initial_in_flight(0, {"w": np.zeros(2)}) is None
  ring = initial_in_flight(2, {"w": np.zeros(2)})
  assert len(ring) == 2
  assert shift(ring, "v1") == (ring[1], "v1")


class _Rl(dict):
  def get(self, key, default=None):
    return dict.get(self, key, default)


def test_bad_staleness_settings_are_refused_in_one_sentence():
  with pytest.raises(ConfigError, match=r"rl.max_staleness=-1 must be a whole number"):
    check_pipeline(_Rl(max_staleness=-1), "host", True, False)
  with pytest.raises(ConfigError, match=r"train.experience_source='fused' does not do"):
    check_pipeline(_Rl(max_staleness=1), "fused", False, False)
  with pytest.raises(ConfigError, match=r"rl.dynamic_sampling"):
    check_pipeline(_Rl(max_staleness=2), "host", True, True)
  check_pipeline(_Rl(max_staleness=0), "fused", False, True)  # today's runs: nothing refused


def test_device_calls_run_in_the_main_thread_in_step_order_whatever_the_host_waits():
  """Producers whose host work takes random times: the main thread still serves their device
  calls in the order the step numbers fix (batch t + k's sampling, then batch t's remaining
  calls), and batch t gets the params of version max(0, t - k)."""
  def one_run(k, steps=6):
    served, schedule = [], Schedule(k, steps)
    ring, versions = initial_in_flight(k, "v0"), {}

    def start(batch, params):
      versions[batch] = params

      def produce(lane):
        lane.call(lambda: served.append((f"sample {batch}", threading.current_thread()
                                         is threading.main_thread())))
        time.sleep(random.uniform(0, 0.02))  # the host reward
        lane.call(lambda: served.append((f"greedy {batch}", True)))
        return batch
      return Producer(produce)

    for step in range(steps):
      got, _ = schedule.take(step, ring, f"v{step}", start)
      assert got == step
      ring = shift(ring, f"v{step}")
    return served, versions

  served, versions = one_run(1)
  assert all(main for _, main in served)
  assert [s for s, _ in served][:5] == ["sample 0", "sample 1", "greedy 0", "sample 2",
                                        "greedy 1"]
  assert versions == {0: "v0", 1: "v0", 2: "v1", 3: "v2", 4: "v3", 5: "v4"}
  for _ in range(3):
    assert one_run(1)[0] == served
  assert one_run(2)[1] == {0: "v0", 1: "v0", 2: "v0", 3: "v1", 4: "v2", 5: "v3"}


def test_a_producer_error_reaches_the_loop():
  def produce(lane):
    lane.call(lambda: None)
    raise ValueError("the reward server said no")
  with pytest.raises(ValueError, match="said no"):
    Schedule(1, 2).take(0, ("v0",), "v0", lambda b, p: Producer(produce))


@pytest.fixture(scope="module")
def async_reference(tmp_path_factory, env):
  """The uninterrupted max_staleness=1 run, rewards without waits."""
  workdir = tmp_path_factory.mktemp("async") / "run"
  run(workdir, env, *ASYNC)
  return workdir, records(workdir)


def test_async_rows_are_one_update_stale_and_learning_moves(async_reference):
  _, recs = async_reference
  steps = [r for r in recs if r["step"] > 0]
  assert [r["experience_staleness"] for r in steps] == [0, 1, 1, 1, 1, 1]
  assert all(r["weight_sync_bytes"] > 0 for r in steps)
  assert all(np.isfinite(r["loss"]) for r in steps)


def test_async_repeats_bit_for_bit_with_randomly_delayed_rewards(async_reference, tmp_path, env):
  workdir, want = async_reference
  run(tmp_path / "run", {**env, "GRPO_JAX_TEST_REWARD_DELAY": "0.3"}, *ASYNC)
  assert strip(records(tmp_path / "run")) == strip(want)
  assert_trees_equal(raw_state(tmp_path / "run", 6), raw_state(workdir, 6))


def test_async_killed_mid_pipeline_resumes_bit_for_bit(async_reference, tmp_path, env):
  """SIGTERM once step 4 is written (batch 5 then in the making, sampled by version 3): the run
  saves step 4 with the in-flight weights, and the resumed one regenerates batch 5 from them."""
  workdir, want = async_reference
  status, _, _ = start_and_signal(tmp_path / "run", env, signal.SIGTERM, 4, 0.0, *ASYNC)
  assert status != 0
  run(tmp_path / "run", env, *ASYNC)
  assert strip(records(tmp_path / "run")) == strip(want)
  assert_trees_equal(raw_state(tmp_path / "run", 6), raw_state(workdir, 6))
