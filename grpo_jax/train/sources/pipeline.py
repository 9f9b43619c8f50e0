"""Asynchronous experience with bounded staleness (rl.max_staleness = k > 0), reproducible to the
bit: the batch of step t is sampled by the policy of step v(t) = max(0, t - k), a function of the
step number alone, never of timing. Nothing is dropped (admission control): batch t is learned
at step t, sampled by weights at most k updates old.

The schedule, at step s (the learner about to apply update s):

    start batch s + k   its producer thread, with a copy of the current params (version s)
    serve its first     the sampler call of that batch, run by this (main) thread now
    learn batch s       wait for batch s's producer (its host rewards ran in its thread
                        while the devices sampled and updated), then update s

Device calls (sampling, greedy baselines) always run in the main thread, in an order that the
step numbers alone fix: a producer thread's device call waits in its `Lane` until the main
thread serves it (the newest batch's first call at its start, the others while the loop waits
for that batch). Host work (reward functions, remote reward calls, tokenisation) runs in the
producer threads while the devices work. So every process of a multi-host run issues the same
device programs in the same order, and a batch's rows are a pure function of (its weights
version, its data position, its rollout key): the same as the synchronous run's batch t in
everything but the weights.

What is in flight is the SourceState's `in_flight`: the trainable params of the k versions
v(s) ... v(s + k - 1) that sample batches s ... s + k - 1. It is checkpointed with the step, so
a resumed run regenerates those batches from them, bit for bit (`initial_in_flight`, `shift`).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.config import ConfigError
from grpo_jax.interrupts import interruptible


def behaviour_version(step: int, max_staleness: int) -> int:
  """v(t) = max(0, t - k): the policy version that samples the batch of step t."""
  return max(0, step - max_staleness)


def copy_params(tree):
  """New buffers holding the same values (the learner's step donates the originals)."""
  return jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, tree)


def initial_in_flight(max_staleness: int, params):
  """The SourceState's in_flight at step 0: k copies of the starting params (batches 0 ... k-1
  are all sampled by version 0); None when k = 0 (the synchronous run's state, unchanged)."""
  if not max_staleness:
    return None
  return tuple(copy_params(params) for _ in range(max_staleness))


def shift(in_flight: tuple, newest) -> tuple:
  """The in_flight of the next step: the oldest version (it sampled the batch just learned)
  out, `newest` (the params of the step being applied, copied) in."""
  return tuple(in_flight[1:]) + (newest,)


MAX_STALENESS = 64


def check_pipeline(rl, settings_name: str, pipelines: bool, dynamic_sampling: bool) -> None:
  """rl.max_staleness is a count of updates, and runs only on a source that pipelines."""
  k = rl.get("max_staleness", 0)
  if not isinstance(k, int) or k < 0:
    raise ConfigError(f"rl.max_staleness={k!r} must be a whole number of updates >= 0 (0: "
                      f"synchronous); set e.g. rl.max_staleness=1.")
  if not k:
    return
  if k > MAX_STALENESS:  # each step of staleness is one traced copy of the params
    raise ConfigError(f"rl.max_staleness={k} keeps {k} copies of the policy's parameters in "
                      f"memory (one per update a batch may lag); use at most {MAX_STALENESS} "
                      f"(docs/async.md's runs use 1).")
  if not pipelines:
    raise ConfigError(f"rl.max_staleness={k} overlaps the sampling of later batches with the "
                      f"update, which train.experience_source={settings_name!r} does not do; "
                      f"set train.experience_source='host' or rl.max_staleness=0.")
  if dynamic_sampling:
    raise ConfigError(f"rl.max_staleness={k} with rl.dynamic_sampling: a batch's data position "
                      f"would depend on how many prompts the batch before it drew, which "
                      f"serialises the pipeline; set rl.dynamic_sampling=False or "
                      f"rl.max_staleness=0.")


_DONE = object()


class Lane:
  """A producer thread's device calls, run by the main thread when it serves them (see the
  module docstring): call() in the producer blocks until the main thread has run it."""

  def __init__(self):
    self._requests = queue.Queue()

  def call(self, fn: Callable, *args):
    request = Future()
    self._requests.put((fn, args, request))
    return request.result()

  def wrap(self, fn: Callable) -> Callable:
    return lambda *args: self.call(fn, *args)

  def done(self) -> None:
    self._requests.put(_DONE)

  def serve(self, until_done: bool) -> bool:
    """Runs the producer's next device call (until_done: every call until it finishes);
    returns whether the producer has finished. Waits in slices, so a signal is seen."""
    while True:
      with interruptible():
        item = self._next()
      if item is _DONE:
        return True
      fn, args, request = item
      try:
        request.set_result(fn(*args))
      except BaseException as e:  # noqa: BLE001  the producer raises it; the loop sees it
        request.set_exception(e)
        if not isinstance(e, Exception):
          raise
      if not until_done:
        return False

  def _next(self):
    while True:
      try:
        return self._requests.get(timeout=0.05)
      except queue.Empty:
        continue


class Producer:
  """One batch in the making: `produce(lane)` in its own (daemon) thread."""

  def __init__(self, produce: Callable):
    self.lane = Lane()
    self.result = Future()
    self.finished = False

    def run():
      try:
        self.result.set_result(produce(self.lane))
      except BaseException as e:  # noqa: BLE001  handed to the main thread
        self.result.set_exception(e)
      finally:
        self.lane.done()
    threading.Thread(target=run, daemon=True, name="grpo_jax-producer").start()

  def start(self) -> None:
    """Serves the producer's first device call (its sampling) now, in the main thread."""
    self.finished = self.lane.serve(until_done=False)

  def wait(self):
    """Serves its remaining device calls until it finishes; its result (or its error)."""
    if not self.finished:
      self.finished = self.lane.serve(until_done=True)
    return self.result.result()


class Schedule:
  """The producers in flight, by batch (step) number: batch t starts with the weights of
  version v(t), and is learned at step t."""

  def __init__(self, max_staleness: int, steps: int):
    self.k, self.steps = max_staleness, steps
    self.in_flight: dict[int, Producer] = {}

  def take(self, step: int, in_flight: tuple, current, start: Callable):
    """The finished batch of `step`, having started every batch up to step + k that is not
    running: start(batch, params) -> a Producer (params: in_flight's entry for batches
    step ... step + k - 1, `current` for step + k). Returns (result, seconds waited)."""
    for offset in range(self.k + 1):
      batch = step + offset
      if batch in self.in_flight or batch >= self.steps:
        continue
      params = in_flight[offset] if offset < self.k else current
      self.in_flight[batch] = start(batch, params)
      self.in_flight[batch].start()
    for old in [b for b in self.in_flight if b < step]:  # (none unless the loop restarted)
      del self.in_flight[old]
    waited = time.perf_counter()
    result = self.in_flight.pop(step).wait()
    return result, time.perf_counter() - waited
