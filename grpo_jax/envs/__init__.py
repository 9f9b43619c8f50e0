"""Multi-turn environments and the tools their episodes call: the protocol (this docstring is
its spec) and the registries. Everything here is plain Python on the host.

An environment, registered by name (env.name) like tasks and rewards:

    @register_environment("my_env")
    class MyEnv:
      max_turns = 4                    # an episode ends on done, max_turns or the token budget
      max_concurrency = 16             # episodes stepped at once (threads; envs/runner.py)
      tools = (CALCULATOR,)            # the Tools it offers (envs/tools.py), or ()

      def reset(self, row, seed) -> tuple[state, list[message]]: ...
      def step(self, state, assistant_turn: str) -> StepResult: ...

* ``reset(row, seed)``: the episode's state and its first messages (chat dicts, e.g. the
  system and user turns). The state is the environment's own value, handed back to `step`; an
  environment keeps nothing of an episode in itself, so episodes can run concurrently and in
  any order.
* ``step(state, assistant_turn)``: the assistant's turn (its text, decoded from the sampled
  ids for reading only: the trajectory keeps the sampled ids) -> StepResult(state, the new
  messages (tool results as role "tool", the user's reply as "user"), a reward or None, done).
  Rewards per turn go through the per-step rewards; a final reward comes with done.
* Tool calls are parsed by a registered parser (envs/parsers.py, "hermes" or "pythonic") and
  run by `call_tools` (envs/tools.py): malformed calls, unknown tools, bad arguments, tool
  exceptions and time-outs come back as a "tool" message that says what went wrong, counted by
  kind, and never end the run.

Built-in tools (envs/builtin_tools.py): a calculator (a safe arithmetic parser, no eval), a
Python executor in a subprocess sandbox (envs/sandbox.py) and retrieval over a local corpus.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from grpo_jax.registry import Registry

ENVIRONMENTS = Registry("env.name")


class StepResult(NamedTuple):
  """What an environment's step returns."""
  state: Any
  messages: list  # chat dicts appended after the assistant's turn
  reward: Optional[float] = None  # this turn's reward (None: none yet)
  done: bool = False


def register_environment(name: str, replace: bool = False):
  """Class decorator: registers an environment class under env.name=name."""
  return ENVIRONMENTS.register(name, replace=replace)
