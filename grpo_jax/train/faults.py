"""What stops a run, and how: SIGTERM (preemption), too many skipped updates, and reward
functions that raise or return non-finite values."""

from __future__ import annotations

import signal
import threading

import numpy as np

from grpo_jax.train.evaluation import take_rows

# Exit status of a run stopped by SIGTERM / SIGINT (Ctrl-C) after saving its checkpoint (128 +
# the signal's number, as a shell reports a process killed by it), so that a supervisor can tell
# it from a finished run.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # 143
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT  # 130


class RunStopped(RuntimeError):
  """The run cannot go on; the message says why and what to do."""


class RewardError(RunStopped):
  """A reward function raised or returned a non-finite value."""


class Preempted(Exception):
  """SIGTERM or SIGINT arrived; the state of the step reached was checkpointed (or, during the
  warm-up, nothing was: a resume runs the warm-up again, a pure function of the seed)."""

  def __init__(self, message: str, signum: int = signal.SIGTERM):
    super().__init__(message)
    self.exit_code = 128 + int(signum)


class TerminationFlag:
  """While entered, SIGTERM and SIGINT (Ctrl-C) only set `self.requested` and `self.signal`:
  the loop saves and stops at the end of the step, the warm-up at the end of its step. A second
  Ctrl-C stops at once (KeyboardInterrupt). Installs nothing outside the main thread, where
  signals cannot be handled."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self.signal = None
    self._previous = {}

  @property
  def name(self) -> str:
    return signal.Signals(self.signal).name if self.signal else ""

  def _handle(self, signum, frame):  # noqa: ARG002
    if signum == signal.SIGINT and self.signal == signal.SIGINT:
      raise KeyboardInterrupt  # Ctrl-C twice: do not wait for the save
    self.requested, self.signal = True, signum

  def stop(self, message: str) -> "Preempted":
    """The Preempted to raise once the loop has done what it does before stopping."""
    return Preempted(f"{self.name}: {message}", self.signal or signal.SIGTERM)

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
    return self

  def __exit__(self, *exc):
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    self._previous = {}
    return False


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


def _text(tokenizer, tokens, mask, limit: int = 300) -> str:
  text = tokenizer.decode(np.asarray(tokens)[np.asarray(mask, bool)].tolist())
  return text if len(text) <= limit else text[:limit] + "..."


def _score_rows(task, prompts, tokens, mask, group_size: int):
  """Scores each completion alone: (rewards, {row: (what went wrong, exception or None)})."""
  rewards, failures = [], {}
  for row in range(tokens.shape[0]):
    one = take_rows(prompts, np.array([row // group_size]))
    try:
      r = float(np.asarray(task.score(one, tokens[row:row + 1], mask[row:row + 1], 1))[0])
      if not np.isfinite(r):
        failures[row] = (f"returned {r}", None)
    except Exception as e:  # noqa: BLE001  a user's reward function may raise anything
      r, failures[row] = None, (f"raised {type(e).__name__}: {e}", e)
    rewards.append(0.0 if row in failures else r)
  return np.asarray(rewards, np.float32), failures


def reward_name(task) -> str:
  """The name of the reward function a task scores with, for messages."""
  reward = getattr(task, "reward", None)
  name = getattr(reward, "name", None) or getattr(getattr(task, "reward_fn", None), "__name__",
                                                  None)
  return name or type(task).__name__


def _check_reward_shape(task, rewards, rows: int) -> None:
  """One number per completion, or a RewardError naming the reward and the expected shape (a
  bug of the reward function, whatever train.on_reward_error says)."""
  if rewards is not None:
    try:
      shape = np.shape(np.asarray(rewards, np.float64))
    except (TypeError, ValueError):
      shape = "not numeric"
    if shape == (rows,):
      return
  got = "None" if rewards is None else (
      f"values of shape {shape}" if isinstance(shape, tuple) else "values that are not numbers")
  raise RewardError(f"the reward function {reward_name(task)!r} returned {got} for {rows} "
                    f"completions; it must return one finite number per completion, shape "
                    f"({rows},).")


def check_reward_error_fraction(errors: int, scored: int, limit: float, step: int) -> None:
  """With train.on_reward_error='zero': stops the run when more than `limit` of a step's
  scored completions failed (a broken reward would otherwise train on zeros)."""
  if scored and errors / scored > limit:
    raise RunStopped(f"the rewards of {errors} of step {step}'s {scored} completions failed "
                     f"({errors / scored:.0%}, above train.max_reward_error_fraction={limit}); "
                     f"fix the reward function (run with train.on_reward_error='raise' to see "
                     f"the first failure), or raise the limit.")


def guarded_score(task, prompts, tokens, mask, group_size: int, on_error: str):
  """task.score(prompts, tokens, mask, group_size) -> (rewards, failed (B,) bool).

  A completion whose reward raises or is not finite stops the run with a RewardError showing
  its prompt and completion (on_error="raise"), or is scored 0 and marked failed
  (on_error="zero"; the caller counts them and zeroes what else it scores for those rows).
  """
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  try:
    rewards = task.score(prompts, tokens, mask, group_size)
  except Exception as e:  # noqa: BLE001
    ok, first_error = None, e
  else:
    _check_reward_shape(task, rewards, tokens.shape[0])
    ok, first_error = np.isfinite(np.asarray(rewards, np.float64)), None
  if ok is not None and ok.all():
    return np.asarray(rewards, np.float32), np.zeros(tokens.shape[0], bool)
  rewards, failures = _score_rows(task, prompts, tokens, mask, group_size)
  if not failures:  # the batch failed but every completion scores alone: a batch-level bug
    what = repr(first_error) if first_error is not None else "non-finite values"
    raise RewardError(f"the reward function failed on the whole batch ({what}) but on no "
                      f"completion alone; fix its batch handling.") from first_error
  if on_error == "raise":
    row, (what, error) = min(failures.items())
    one = take_rows(prompts, np.array([row // group_size]))
    prompt = _text(task.tokenizer, one.prompt_tokens[0], one.prompt_mask[0])
    raise RewardError(
        f"the reward function {what} for the prompt {prompt!r} and the completion "
        f"{_text(task.tokenizer, tokens[row], mask[row])!r}; fix the reward function, or set "
        f"train.on_reward_error='zero' to score such completions 0 and count them.") from error
  return rewards, np.isin(np.arange(tokens.shape[0]), list(failures))
