"""The loop skeleton the training stages run on: the RL loop (train/stages/rl.py) and the SFT and
reward-model stages (train/stages/supervised.py). A stage brings its own `advance` (one call moves the state one or more
steps and returns their records), `evaluate` and `write`; the skeleton owns the order of
things, the same for every stage:

  step 0 (not resumed)   evaluate, write, checkpoint (when checkpoint_every > 0)
  each call              SIGTERM / SIGINT: checkpoint, then stop (a resume continues from it);
                         the same within seconds when they arrive during a host wait; a
                         remote outage or a reward past its time limit saves the last step too
                         advance -> check -> evaluation when due (into the last step's
                         records) -> write -> checkpoint when due (and at the last step)

Restoring, the workdir's lock and records, and what a stage writes stay with the stage: the
skeleton sees a state that is fresh or `resumed`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable

from grpo_jax import interrupts
from grpo_jax.errors import StopAfterSaving, first_line
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
  which compiles; the first call's own until there is a second, `compiled` False)."""
  elapsed_s: float
  steps_done: int
  seconds_per_step: float
  compiled: bool = True

  def eta(self, remaining_steps: int) -> str:
    """`eta 1m05s`, from compiled steps only: the first call's compile would inflate it."""
    if not self.compiled:
      return "eta after the next step (this one compiled)"
    seconds = int(max(remaining_steps, 0) * self.seconds_per_step)
    return f"eta {seconds // 60}m{seconds % 60:02d}s"


@contextlib.contextmanager
def _saved_on_a_host_stop(state, ckpts, sigterm, before_save: Callable = lambda: None,
                          save: bool = True):
  """A signal inside a host wait (HostInterrupted), or a fault of the step in flight
  (StopAfterSaving: a remote service past its retry budget, a reward function past its time
  limit): `state`, the last completed step, is checkpointed (after before_save()), then the
  run stops with Preempted (the signal's exit status) or the same error, saying where it saved
  (save=False: the step-0 evaluation, before the first checkpoint: nothing is)."""
  try:
    yield
  except interrupts.HostInterrupted:
    if not save:
      raise sigterm.stop("stopped during the step-0 evaluation, before the first checkpoint; "
                         "run the same command again to start over.") from None
    where = _save(state, ckpts, before_save)
    raise sigterm.stop(f"stopped while waiting on the host (a reward, a reward server or a "
                       f"teacher); {where}; run the same command again to resume.") from None
  except StopAfterSaving as e:  # a remote outage, a reward function past its time limit
    if not save:
      raise
    where = _save(state, ckpts, before_save)
    raise type(e)(f"{str(e).rstrip('.')} ({where}; run the same command again to resume "
                  f"once that is fixed).") from None


def _save(state, ckpts, before_save: Callable) -> str:
  """Checkpoints the last completed step; says where, or why nothing was saved."""
  before_save()  # (writing the step's records may itself stop the run: its own error)
  try:
    ckpts.save(state)
  except Exception as e:  # noqa: BLE001  the stop's own message must still reach the user
    return (f"saving step {step_of(state)} failed ({first_line(e)}), so the newest checkpoint "
            f"in {ckpts.directory} is the one to resume from")
  return f"saved checkpoint {ckpts.directory}/{step_of(state)}"


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
    with _saved_on_a_host_stop(state, ckpts, sigterm, save=False):
      evals = evaluate(state, 0)
    write(state, 0, [evals], None, None, None)
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
    with _saved_on_a_host_stop(state, ckpts, sigterm):  # nothing of the step is done yet
      state, records, tokens = advance(state)
    step = step_of(state)
    check(state, records)

    def write_records():
      now = time.perf_counter()
      if step - len(records) > first:  # not this process's first call
        steady[0], steady[1] = steady[0] + now - called, steady[1] + len(records)
      per_step = steady[0] / steady[1] if steady[1] else (now - called) / len(records)
      write(state, step - len(records) + 1, records, tokens, now - called,
            Clock(now - start, step - first, per_step, steady[1] > 0))

    if step % schedule.eval_every == 0 or step == schedule.steps:
      # A stop inside the evaluation's host waits keeps the step: written without it, saved.
      with _saved_on_a_host_stop(state, ckpts, sigterm, write_records):
        for record, metrics in zip(records[-1], evaluate(state, step)):
          record.update(metrics)
    write_records()
    if (schedule.checkpoint_every and step % schedule.checkpoint_every == 0) or \
        step == schedule.steps:
      ckpts.save(state)
  return state
