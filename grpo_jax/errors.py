"""The errors a user fixes by changing what they gave: one sentence naming the value and the
fix. `grpo_jax.main` (and `grpo_jax.eval`) print it as one line and exit with status 2, before
any compute and before anything is written to the workdir."""


class ConfigError(ValueError):
  """A config value that cannot work; the message says which and how to fix it."""


class InputError(ConfigError):
  """A file or folder the config points at (data, model checkpoint, tokenizer, workdir) that
  cannot be used; the message names it and says how to fix it."""


def first_line(error: BaseException, limit: int = 300) -> str:
  """`Type: first line of the message`, for wrapping a library's error into one sentence."""
  lines = str(error).strip().splitlines()
  text = lines[0][:limit] if lines else ""
  return f"{type(error).__name__}: {text}" if text else type(error).__name__
