"""The real training loop compiles everything in its first step and nothing after it.

Every XLA backend compilation is counted through jax.monitoring (the event jax records for
each one, with the function's name), and attributed to the step whose metrics are written next.
"""

import collections

import jax
import pytest

from configs import grpo_tiny
from grpo_jax.train.stages import rl as loop

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _tiny_config(decode_slots=0, **rl):
  config = grpo_tiny.get_config()
  config.warmup.steps = 5
  config.train.steps = 3
  config.train.eval_every = 2  # an eval inside the run (step 2) and at the end (step 3)
  config.train.eval_size = 20
  config.train.eval_batch_size = 20
  config.rollout.num_prompts = 4
  config.rollout.group_size = 4
  config.rollout.decode_slots = decode_slots
  config.rl.update(rl)
  return config


class _Recorder:
  """Compilations per step: the names compiled before step s's metrics are written."""

  def __init__(self):
    self.pending, self.per_step = [], collections.OrderedDict()

  def on_event(self, event, duration, **kwargs):
    del duration
    if event == COMPILE_EVENT:
      self.pending.append(kwargs.get("fun_name", "?"))

  def close_step(self, step):
    self.per_step[step] = self.pending
    self.pending = []


@pytest.mark.parametrize("rl", [
    dict(),  # the tiny recipe: one pass, one minibatch, k3 KL in the loss
    dict(num_iterations=2, num_minibatches=2, adaptive_kl=True),  # mu > 1, KL controller
    dict(decode_slots=6),  # the slot-refill engine (16 rollout rows, 20 eval rows)
])
def test_no_compilation_after_the_first_step(tmp_path, monkeypatch, rl):
  recorder = _Recorder()

  class CountingWriter(loop.MetricsWriter):
    def write(self, step, metrics, prefix=""):
      recorder.close_step(int(step))
      super().write(step, metrics, prefix)

  monkeypatch.setattr(loop, "MetricsWriter", CountingWriter)
  jax.monitoring.register_event_duration_secs_listener(recorder.on_event)
  try:
    loop.train(_tiny_config(**rl), str(tmp_path), log=lambda *_: None)
  finally:
    jax.monitoring.unregister_event_duration_listener(recorder.on_event)
  steps = recorder.per_step
  assert list(steps) == [0, 1, 2, 3]
  assert steps[1], "the first step should compile the rollout, preparation and update"
  assert steps[2] == [] and steps[3] == [], {s: steps[s] for s in (2, 3)}


def test_the_compile_log_counts_a_programs_trace_with_its_compile():
  """jax reports the trace under the function's name and the lowering and compile under
  "jit(<name>)": the trace's time was never in the said "+X s tracing and lowering", and
  table() had a second row with no program. One row now, said as the compile names it."""
  import time  # noqa: PLC0415
  from grpo_jax import compile_log  # noqa: PLC0415
  said, unique = [], float(time.time_ns() % 100_000)  # (no persistent-cache hit)

  def slow_to_trace(x):
    time.sleep(0.3)
    return x * 2 + unique

  compile_log.install(said.append, min_s=0.0)
  try:
    compile_log.reset()
    jax.jit(slow_to_trace)(jax.numpy.ones(3))
    rows = {k: v for k, v in compile_log.table().items() if "slow_to_trace" in k}
  finally:
    compile_log.install(None)
  assert list(rows) == ["slow_to_trace"] and rows["slow_to_trace"]["programs"] == 1
  assert rows["slow_to_trace"]["trace_s"] >= 0.3
  line = next(s for s in said if "slow_to_trace" in s)
  assert line.startswith("compiled jit(slow_to_trace) in ")
  assert float(line.split("(+")[1].split(" s tracing")[0]) >= 0.3, line
