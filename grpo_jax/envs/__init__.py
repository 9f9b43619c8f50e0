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
  The reward of the step that ends the episode (done, or its env.max_turns-th turn) is the
  episode's reward; a reward with done False is not read otherwise, so an environment that
  rewards each turn returns the running total (as the OpenEnv adapter does). An episode cut
  by the token budget (env.max_completion_tokens) scores 0.
* ``end_episode(state)`` (optional): called once per episode when its batch is played,
  whatever ended it (done, max_turns, the token budget): release what the state holds (the
  OpenEnv adapter closes the episode's environment here).
* Tool calls are parsed by a registered parser (envs/parsers.py, "hermes" or "pythonic") and
  run by `call_tools` (envs/tools.py): malformed calls, unknown tools, bad arguments, tool
  exceptions and time-outs come back as a "tool" message that says what went wrong, counted by
  kind, and never end the run.

* What a step returns is checked (`check_step_result`): anything but a StepResult of a list of
  {role, content} string messages, a finite reward or None and a bool `done` stops the run in
  one sentence naming the environment (exit 2); a message's text that is not valid Unicode
  reaches the model with U+FFFD in place of each lone surrogate.

Built-in tools (envs/builtin_tools.py): a calculator (a safe arithmetic parser, no eval), a
Python executor isolated by the OS (envs/sandbox.py) and retrieval over a local corpus.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

from grpo_jax.registry import Registry

# env.name -> the environment's class. A class with a JAX form (train.experience_source=
# "fused_episodes") has a `jax_form(env, tokenizer)` staticmethod giving its JAX spec
# (envs/calculator.py's, envs/calculator_jax.py): one registry, the form an entry may carry.
ENVIRONMENTS = Registry("env.name")


def jax_form(name: str):
  """The registered environment `name`'s jax_form (env, tokenizer) -> spec, or None."""
  return getattr(ENVIRONMENTS.get(name), "jax_form", None) if name in ENVIRONMENTS else None


def jax_form_names() -> list:
  """The env.names whose environment has a JAX form."""
  return [name for name in ENVIRONMENTS.names() if jax_form(name) is not None]


class StepResult(NamedTuple):
  """What an environment's step returns."""
  state: Any
  messages: list  # chat dicts appended after the assistant's turn
  reward: Optional[float] = None  # this turn's reward (None: none yet)
  done: bool = False


def check_step_result(result, env) -> StepResult:
  """`result` as a StepResult an episode can take (a plain 2-4 tuple is read as one, message
  texts with lone surrogates cleaned), or an InputError naming the environment and the fault."""
  import numbers  # noqa: PLC0415

  from grpo_jax.unicode_text import clean_text  # noqa: PLC0415
  from grpo_jax.errors import InputError  # noqa: PLC0415

  def bad(what: str):
    raise InputError(f"the environment {type(env).__name__}'s step returned {what}; return "
                     f"StepResult(state, messages: a list of {{'role', 'content'}} dicts of "
                     f"strings, reward: a finite number or None, done: a bool).")
  if isinstance(result, tuple) and not isinstance(result, StepResult) and 2 <= len(result) <= 4:
    result = StepResult(*result)
  if not isinstance(result, StepResult):
    bad(f"a {type(result).__name__}, not a StepResult")
  messages = result.messages
  if not isinstance(messages, list) or not all(
      isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
      for m in messages):
    bad(f"messages {str(messages)[:60]!r}, not a list of {{'role', 'content'}} string dicts")
  reward = result.reward
  if reward is not None and (isinstance(reward, bool) or not isinstance(reward, numbers.Real)
                             or not math.isfinite(float(reward))):
    bad(f"reward={str(reward)[:40]!r}")
  if not isinstance(result.done, bool) and type(result.done).__name__ != "bool_":
    bad(f"done={str(result.done)[:40]!r}")
  return result._replace(messages=[{**m, "content": clean_text(m["content"])} for m in messages])


def register_environment(name: str, replace: bool = False):
  """Class decorator: registers an environment class under env.name=name."""
  return ENVIRONMENTS.register(name, replace=replace)
