"""The loop skeleton the training stages run on: the RL loop (train/stages/rl.py) and the SFT and
reward-model stages (train/stages/supervised.py). A stage brings its own `advance` (one call moves the state one or more
steps and returns their records), `evaluate` and `write`; the skeleton owns the order of
things, the same for every stage:

  step 0 (not resumed)   evaluate, write, checkpoint (when checkpoint_every > 0)
  each call              SIGTERM / SIGINT: checkpoint, then stop (a resume continues from it)
                         advance -> check -> evaluation when due (into the last step's
                         records) -> write -> checkpoint when due (and at the last step)

Restoring, the workdir's lock and records, and what a stage writes stay with the stage: the
skeleton sees a state that is fresh or `resumed`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from grpo_jax.train.run.checkpoint import step_of


@dataclasses.dataclass(frozen=True)
class Schedule:
  steps: int  # the run ends at this step
  eval_every: int  # evaluate at multiples of it (and at the last step)
  checkpoint_every: int  # checkpoint at multiples of it and at step 0; 0: the last step only


@dataclasses.dataclass(frozen=True)
class Clock:
  """Where the loop stands for progress lines: seconds since its first call, steps done, and
  the seconds a step takes once compiled (the mean over the calls after this process's first,
  which compiles; the first call's own until there is a second), for the ETA."""
  elapsed_s: float
  steps_done: int
  seconds_per_step: float


def run_steps(state, advance: Callable, evaluate: Callable, write: Callable, *,
              schedule: Schedule, ckpts, sigterm, resumed: bool,
              check: Callable = lambda state, records: None):
  """Runs `advance` until schedule.steps; returns the last state.

  advance(state) -> (state, records, tokens): records one list of per-seed dicts per step the
    call ran, tokens one count per step (or None);
  evaluate(state, step) -> per-seed metrics dicts;
  write(state, first_step, records, tokens, seconds, clock): the records of steps
    first_step, ...; at step 0 the evaluation alone (records [evals], tokens, seconds and
    clock None), after that the call's records, its wall seconds and a Clock (it may raise
    to stop, once written);
  check(state, records): after each call, before anything is written (raises to stop).
  ckpts: checkpoint.Checkpoints; sigterm: faults.TerminationFlag, entered by the caller.
  """
  if not resumed:
    write(state, 0, [evaluate(state, 0)], None, None, None)
    if schedule.checkpoint_every:
      ckpts.save(state)
  first, start = step_of(state), time.perf_counter()
  steady = [0.0, 0]  # seconds and steps of the calls after the first (compiled already)
  while step_of(state) < schedule.steps:
    if sigterm.requested:
      ckpts.save(state)
      raise sigterm.stop(f"saved checkpoint {ckpts.directory}/{step_of(state)}; run the same "
                         f"command again to resume from it.")
    called = time.perf_counter()
    state, records, tokens = advance(state)
    step = step_of(state)
    check(state, records)
    if step % schedule.eval_every == 0 or step == schedule.steps:
      for record, metrics in zip(records[-1], evaluate(state, step)):
        record.update(metrics)
    now = time.perf_counter()
    if step - len(records) > first:  # not this process's first call
      steady[0], steady[1] = steady[0] + now - called, steady[1] + len(records)
    per_step = steady[0] / steady[1] if steady[1] else (now - called) / len(records)
    write(state, step - len(records) + 1, records, tokens, now - called,
          Clock(now - start, step - first, per_step))
    if (schedule.checkpoint_every and step % schedule.checkpoint_every == 0) or \
        step == schedule.steps:
      ckpts.save(state)
  return state
