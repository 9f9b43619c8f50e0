"""The error a user can fix by changing the config: one sentence naming the value and the fix.
`grpo_jax.main` prints it as one line and exits with status 2, before any compute."""


class ConfigError(ValueError):
  """A config value that cannot work; the message says which and how to fix it."""
