"""What stops a run, and how: SIGTERM (preemption), too many skipped updates, and reward
functions that raise or return non-finite values."""

from __future__ import annotations

import signal
import threading

from grpo_jax import interrupts
from grpo_jax.errors import RewardError, RunStopped  # noqa: F401  (raised by the run)

# Exit status of a run stopped by SIGTERM / SIGINT (Ctrl-C) after saving its checkpoint (128 +
# the signal's number, as a shell reports a process killed by it), so that a supervisor can tell
# it from a finished run.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # 143
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT  # 130


class Preempted(Exception):
  """SIGTERM, SIGINT or SIGHUP arrived; the state of the step reached was checkpointed (or, during the
  warm-up, nothing was: a resume runs the warm-up again, a pure function of the seed)."""

  def __init__(self, message: str, signum: int = signal.SIGTERM):
    super().__init__(message)
    self.exit_code = 128 + int(signum)


class TerminationFlag:
  """While entered, SIGTERM, SIGINT (Ctrl-C) and SIGHUP (the terminal or ssh session that
  started the run closed) only set `self.requested` and `self.signal`: the loop saves and stops
  at the end of the step, the warm-up at the end of its step; inside a host wait
  (grpo_jax/interrupts.interruptible) they also raise HostInterrupted, which the loop turns
  into a save of the last completed step. A second Ctrl-C stops at once
  (KeyboardInterrupt). Installs nothing outside the main thread, where signals cannot be
  handled, and leaves a signal that is ignored when entered (SIGHUP under `nohup`) ignored."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

  def __init__(self):
    self.requested = False
    self.signal = None
    self._previous = {}

  def _handle(self, signum, frame):  # noqa: ARG002
    if signum == signal.SIGINT and self.signal == signal.SIGINT:
      raise KeyboardInterrupt  # Ctrl-C twice: do not wait for the save
    self.requested, self.signal = True, signum
    interrupts.signal_arrived(signum)
    if interrupts.waiting():  # a host wait (reward, server, teacher): stop it now
      raise interrupts.HostInterrupted(signum)

  def stop(self, message: str) -> "Preempted":
    """The Preempted to raise once the loop has done what it does before stopping."""
    name = signal.Signals(self.signal).name if self.signal else ""
    return Preempted(f"{name}: {message}", self.signal or signal.SIGTERM)

  def __enter__(self):
    interrupts.signal_arrived(None)
    # A signal set to be ignored stays ignored: `nohup` (or `trap '' HUP`) asks a run to
    # outlive its terminal, so SIGHUP must not stop it there.
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS
                        if signal.getsignal(s) is not signal.SIG_IGN}
    return self

  def __exit__(self, *exc):
    interrupts.signal_arrived(None)
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    self._previous = {}


def check_skips(consecutive: int, limit: int, step: int) -> None:
  """Raises RunStopped once `limit` optimizer updates in a row were skipped."""
  if consecutive >= limit:
    raise RunStopped(
        f"{consecutive} optimizer updates in a row were skipped for a non-finite loss or "
        f"gradient (at step {step}, train.max_consecutive_skips={limit}); the params are still "
        f"finite, so lower optim.learning_rate, check the rewards, or raise "
        f"train.max_consecutive_skips.")


def check_state_finite(records: list, step: int, newest_saved) -> None:
  """Raises RunStopped if an update left non-finite params or optimizer state (`state_finite`
  0 in a record of the step), before anything of that step is saved; newest_saved() -> the
  newest checkpoint's step, for the message."""
  if all(r.get("state_finite", 1.0) == 1.0 for r in records):
    return
  raise RunStopped(f"the update of step {step} made the params or the optimizer state "
                   f"non-finite although its loss and gradients were finite; nothing of it was "
                   f"saved (the newest checkpoint is step {newest_saved()}), so lower "
                   f"optim.learning_rate or check the model's weights.")


def check_reward_error_fraction(errors: int, scored: int, limit: float, step: int) -> None:
  """With train.on_reward_error='zero': stops the run when more than `limit` of a step's
  scored completions failed (a broken reward would otherwise train on zeros)."""
  if scored and errors / scored > limit:
    raise RunStopped(f"the rewards of {errors} of step {step}'s {scored} completions failed "
                     f"({errors / scored:.0%}, above train.max_reward_error_fraction={limit}); "
                     f"fix the reward function (run with train.on_reward_error='raise' to see "
                     f"the first failure), or raise the limit.")
