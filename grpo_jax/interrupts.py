"""Host waits that SIGTERM and SIGINT can end.

A run's signal handler (train/run/faults.TerminationFlag) only sets a flag that the loop reads
between steps, so that no signal lands in the middle of a device step. A step's host part can
wait far longer than a step: a reward function, a reward server or a teacher that is slow or
hung. Code that waits on the host marks the wait with `interruptible()`; a signal that arrives
inside it raises `HostInterrupted` at once, in the main thread, and the loop saves the last
completed step before it stops (train/run/runner.run_steps).

HostInterrupted derives from BaseException, as KeyboardInterrupt does, so that the
`except Exception` of code that survives a broken reward function cannot swallow it.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_WAITING = threading.local()
_ARRIVED = {"signum": None}  # a signal the run's handler saw and has not acted on yet


class HostInterrupted(BaseException):
  """A signal arrived while the main thread waited on the host (see the module)."""

  def __init__(self, signum: int):
    super().__init__(f"{signal.Signals(signum).name} while waiting on the host")
    self.signum = int(signum)


def signal_arrived(signum: int | None) -> None:
  """Called by the run's signal handler (None: forget it, when the handler is removed)."""
  _ARRIVED["signum"] = signum


def stop_if_signalled() -> None:
  """Raises HostInterrupted when a signal arrived (during a device step, a compile) and the
  loop has not acted on it yet: called before a wait that may take long (a reward function, a
  remote call), so that such a wait never starts after the run was asked to stop."""
  if _ARRIVED["signum"] is not None and threading.current_thread() is threading.main_thread():
    raise HostInterrupted(_ARRIVED["signum"])


@contextlib.contextmanager
def interruptible():
  """While entered (in the main thread), a run's signal handler raises HostInterrupted."""
  depth = getattr(_WAITING, "depth", 0)
  _WAITING.depth = depth + 1
  try:
    yield
  finally:
    _WAITING.depth = depth


def waiting() -> bool:
  """Whether this thread is inside `interruptible()`."""
  return getattr(_WAITING, "depth", 0) > 0
