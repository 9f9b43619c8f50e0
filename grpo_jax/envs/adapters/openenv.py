"""OpenEnv environments (the `openenv-core` package: Gym-style `Environment.reset/step` with
pydantic `Action` / `Observation` models) as grpo_jax environments: env.name="openenv".

The OpenEnv environment runs in this process (no HTTP server, no container): env.environment
names a callable "module:attr" (usually the `Environment` subclass itself) that returns a fresh
environment; each episode gets its own, held in the episode's state, because an OpenEnv
environment is a stateful object (one session each).

Conversion, per episode:

* reset(row, seed): `environment.reset(seed=row["seed"])` (without the seed if its `reset`
  takes none) -> the first messages: [system: env.system_prompt, when set] + [user: the
  observation's text]. Rows are {"seed": s}: "train" s = 0, 1, ..., "test" s = 10^9 + i, so
  the episodes of one GRPO group share their environment's seed.
* step(state, turn): `Action(**{env.action_field: turn})` (the Action class is the one
  `environment.step` annotates, else the `Environment[Action, ...]` base's first argument); an
  action that fails validation becomes a user message "Invalid action: <pydantic's reason>"
  and the episode goes on. Then `environment.step(action)` -> StepResult(messages [user: the
  observation's text] unless done, reward R, done = observation.done).
* The observation's text: its field env.observation_field (checked on a probe environment's
  reset(seed=0) when the adapter is built), or with "" its own fields (all but done, reward,
  metadata) as "name: value" lines (one field: its value alone).
* Reward: R = the sum of the observations' rewards so far (None counts 0), the episode's
  return, reported at every step so that an episode cut at env.max_turns keeps what it earned.
* The episode's environment is closed (`close()`) by `end_episode`, which the episode players
  call once the episode is over, whatever ended it (done, env.max_turns, the token budget).

Without the package, building the environment raises one ConfigError sentence with the pip
command.
"""

from __future__ import annotations

import importlib
import inspect
import typing

from grpo_jax.envs import StepResult, register_environment
from grpo_jax.errors import ConfigError

PIP = "pip install 'grpo_jax[openenv]' (or pip install openenv-core==0.3.0)"
TEST_SEED_BASE = 10 ** 9
_BASE_FIELDS = ("done", "reward", "metadata")


def require_openenv():
  """The `openenv.core.env_server` module, or one ConfigError sentence naming the pip command."""
  try:
    return importlib.import_module("openenv.core.env_server")
  except ModuleNotFoundError as e:
    if (e.name or "").split(".")[0] != "openenv":
      raise
    raise ConfigError(f"env.name='openenv' needs the openenv-core package, which is not "
                      f"installed; {PIP}.") from None


def load_factory(spec: str):
  """The callable named by "module:attr" (env.environment)."""
  module, _, attr = spec.partition(":")
  if not module or not attr:
    raise ConfigError(f"env.environment={spec!r} is not 'module:attr'; name the OpenEnv "
                      f"Environment class, e.g. 'grpo_jax.envs.adapters.openenv_guess:"
                      f"GuessNumberEnvironment'.")
  try:
    return getattr(importlib.import_module(module), attr)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"env.environment={spec!r} cannot be imported ({e}); name an importable "
                      f"'module:attr'.") from None


def action_class(environment, action_base):
  """The Action subclass that `environment.step` takes: its annotation, else the first type
  argument of its `Environment[Action, Observation, State]` base."""
  try:
    hinted = typing.get_type_hints(type(environment).step).get("action")
  except (NameError, TypeError):
    hinted = None
  candidates = [hinted] + [a for base in getattr(type(environment), "__orig_bases__", ())
                           for a in typing.get_args(base)]
  for c in candidates:
    if inspect.isclass(c) and issubclass(c, action_base) and c is not action_base:
      return c
  raise ConfigError(f"{type(environment).__name__}.step names no Action subclass (annotate "
                    f"its `action` parameter) that env.action_field could fill.")


def observation_text(observation, field: str = "") -> str:
  """The user message of an observation: field `field`, or its own fields (all but done,
  reward, metadata) as "name: value" lines; a single own field is its value alone."""
  if field:
    return str(getattr(observation, field))
  own = {k: v for k, v in observation.model_dump().items() if k not in _BASE_FIELDS}
  if len(own) == 1:
    return str(next(iter(own.values())))
  return "\n".join(f"{k}: {v}" for k, v in own.items())


def _reset(environment, seed: int):
  """environment.reset(seed=seed), or reset() when it takes no seed."""
  params = inspect.signature(environment.reset).parameters
  takes_seed = "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
  return environment.reset(seed=seed) if takes_seed else environment.reset()


@register_environment("openenv")
class OpenEnvAdapter:
  """An OpenEnv environment (env.environment) in grpo_jax's protocol; see the module docstring."""

  tools = ()  # (an OpenEnv environment's tools are its actions)

  def __init__(self, *, environment: str = "", action_field: str = "message",
               observation_field: str = "", system_prompt: str = "", max_turns: int = 3,
               max_concurrency: int = 16):
    server = require_openenv()
    if not environment:
      raise ConfigError("env.name='openenv' needs env.environment, the 'module:attr' of an "
                        "OpenEnv Environment class or factory.")
    self.factory = load_factory(environment)
    from pydantic import ValidationError  # noqa: PLC0415  (openenv-core's own dependency)
    self._action_base, self._invalid = server.Action, ValidationError
    self.action_field, self.observation_field = action_field, observation_field
    self.system_prompt, self.max_turns = system_prompt, max_turns
    self.max_concurrency = max_concurrency
    probe = self.factory()
    try:
      self.action_cls = action_class(probe, self._action_base)
      if action_field not in self.action_cls.model_fields:
        raise ConfigError(f"env.action_field={action_field!r} is not a field of "
                          f"{self.action_cls.__name__} (its fields: "
                          f"{', '.join(self.action_cls.model_fields)}); name the one that takes "
                          f"the assistant's text.")
      observation = _reset(probe, 0) if observation_field else None
      if observation_field and not hasattr(observation, observation_field):
        raise ConfigError(f"env.observation_field={observation_field!r} is not a field of "
                          f"{type(observation).__name__} (its fields: "
                          f"{', '.join(type(observation).model_fields)}); name the one that "
                          f"holds the text for the model, or give '' for all of them.")
    finally:
      probe.close()

  def rows(self, split: str, count: int) -> list:
    """Episode seeds: "train" 0, 1, ...; "test" 10^9 + i (disjoint)."""
    base = {"train": 0, "test": TEST_SEED_BASE}[split]
    return [{"seed": base + i} for i in range(count)]

  def reset(self, row: dict, seed: int):
    del seed  # the episode is the row's (its seed), shared by a GRPO group
    environment = self.factory()
    observation = _reset(environment, int(row["seed"]))
    state = dict(environment=environment, turn=0, reward=float(observation.reward or 0.0))
    first = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
    return state, first + [{"role": "user",
                            "content": observation_text(observation, self.observation_field)}]

  def step(self, state: dict, assistant_turn: str) -> StepResult:
    """The turn as the episode's action."""
    return self._step(dict(state, turn=state["turn"] + 1), assistant_turn)

  def end_episode(self, state: dict) -> None:
    """Closes the episode's OpenEnv environment, however the episode ended (done, the last
    turn, or the token budget, which ends it without a step)."""
    state["environment"].close()

  def _step(self, state: dict, assistant_turn: str) -> StepResult:
    try:
      action = self.action_cls(**{self.action_field: assistant_turn})
    except self._invalid as e:
      reason = e.errors()[0].get("msg", str(e))
      return StepResult(state, [{"role": "user", "content": f"Invalid action: {reason}"}],
                        state["reward"], False)
    observation = state["environment"].step(action)
    state["reward"] += float(observation.reward or 0.0)
    if observation.done:
      return StepResult(state, [], state["reward"], True)
    return StepResult(state, [{"role": "user", "content": observation_text(
        observation, self.observation_field)}], state["reward"], False)
