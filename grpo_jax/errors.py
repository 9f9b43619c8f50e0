"""The errors a user fixes by changing what they gave: one sentence naming the value and the
fix. `grpo_jax.main` (and `grpo_jax.eval`) print it as one line and exit with status 2, before
any compute and before anything is written to the workdir."""

import os
import sys


class ConfigError(ValueError):
  """A config value that cannot work; the message says which and how to fix it."""


class InputError(ConfigError):
  """A file or folder the config points at (data, model checkpoint, tokenizer, workdir) that
  cannot be used; the message names it and says how to fix it."""


def require(condition: bool, message: str) -> None:
  """Raises ConfigError(message) unless condition holds (the config checks' helper)."""
  if not condition:
    raise ConfigError(message)


def one_of(value, valid, name) -> None:
  require(value in valid, f"{name}={value!r} is unknown; valid: {', '.join(valid)}.")


class RunStopped(RuntimeError):
  """The run cannot go on; the message says why and what to do."""


class RewardError(RunStopped):
  """A reward function raised or returned a non-finite value."""


class RewardContractError(InputError, RewardError):
  """A reward function broke its contract for a whole batch (values of another count or shape
  than its completions', or not numbers), which no completion alone shows: the user's code to
  fix, so exit 2 like bad input (`main` reads the InputError first), while a caller that
  catches RewardError still does."""


class StopAfterSaving(RunStopped):
  """A fault of the step in flight that the last completed step does not share: the loop
  saves that step before the run stops, so the same command resumes there."""


class RemoteOutage(StopAfterSaving):
  """A remote service (teacher, reward server) failed past its retry budget or its deadline."""


class RemoteRewardOutage(RemoteOutage, RewardError):
  """A reward server past its retry budget (a reward's failure under
  train.on_reward_error='raise', and an outage: the last completed step is saved)."""


class RewardTimeout(StopAfterSaving, RewardError):
  """A reward function did not return within reward.timeout_s."""


def cli_status(action) -> int:
  """A small command's exit status: runs action() and returns 0, or prints its InputError as
  one line on stderr and returns 2."""
  try:
    action()
  except InputError as e:
    print(f"error: {' '.join(str(e).splitlines())}", file=sys.stderr)
    return 2
  return 0


def first_line(error: BaseException, limit: int = 300) -> str:
  """`Type: first line of the message`, for wrapping a library's error into one sentence."""
  lines = str(error).strip().splitlines()
  text = lines[0][:limit] if lines else ""
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


# A command-line run that stops on a failed save ends with its own one sentence, but orbax's
# failed write threads go on printing (tracebacks of a closed event loop, "coroutine was never
# awaited" warnings) before and after it, until the process exits. The command line turns
# muting on (mute_after_a_failed_save); the save's failure then points file descriptor 2 and
# sys.stderr at /dev/null and keeps the real stderr for that sentence (last_word_stream).
# In-process use (a library call, a test) leaves it off (command_line_returned).
_AFTER_FAILED_SAVE = {"mute": False, "stream": None, "sys_stderr": None}


def mute_after_a_failed_save() -> None:
  """Called by the command line: after a failed save, stderr gets the closing sentence only."""
  _AFTER_FAILED_SAVE["mute"] = True


def silence_stderr_for_good(real_stderr_fd: int) -> bool:
  """After a failed save: when the command line asked for it, fd 2 and sys.stderr go to
  /dev/null for the rest of the process and `real_stderr_fd` (a dup of the real stderr, now
  owned here) is kept for the closing sentence; returns whether it did."""
  if not _AFTER_FAILED_SAVE["mute"]:
    return False
  _AFTER_FAILED_SAVE["stream"] = os.fdopen(real_stderr_fd, "w")
  _AFTER_FAILED_SAVE["sys_stderr"] = sys.stderr
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 2)
  os.close(null)
  sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (for the rest of the process)
  return True


def command_line_returned() -> None:
  """The end of a command line run in this process (main.cli): muting off again, and fd 2 and
  sys.stderr back where they were if a failed save or restore pointed them at /dev/null (the
  calling process goes on; a test's later output must reach its capture)."""
  stream = _AFTER_FAILED_SAVE["stream"]
  if stream is not None:
    sys.stderr.close()
    os.dup2(stream.fileno(), 2)
    stream.close()
    sys.stderr = _AFTER_FAILED_SAVE["sys_stderr"]
  _AFTER_FAILED_SAVE.update(mute=False, stream=None, sys_stderr=None)


def last_word_stream():
  """Where the run's closing sentence goes: the real stderr, also once a failed save has
  silenced fd 2 and sys.stderr."""
  return _AFTER_FAILED_SAVE["stream"] or sys.stderr


def json_limit(e: Exception, fix: bool = True) -> str:
  """What json.loads's ValueError (not a JSONDecodeError) or RecursionError says of a text of
  valid JSON, as a sentence's end: an integer past Python's digit limit, or nesting too deep;
  with `fix` False, without the way to rewrite it (a file to restore, not to edit: a workdir's
  record, a checkpoint's config.json)."""
  if isinstance(e, RecursionError):
    return "is nested too deeply to read" + ("; flatten its lists and objects" if fix else "")
  return (f"holds an integer of more than {sys.get_int_max_str_digits()} digits, past what "
          f"Python reads" + ("; write it as a string" if fix else ""))
