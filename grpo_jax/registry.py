"""Named registries: advantage estimators, policy losses, KL estimators, rewards, tasks and
model families each register under the name a config uses, in the module that defines them.

    ESTIMATORS = Registry("rl.advantage")

    @ESTIMATORS.register("my_estimator")
    def my_estimator(inputs): ...

Config validation lists `registry.names()`; `registry.get(name)` fails with one sentence naming
the field, the value and the valid names. A researcher's own entries live in their own file,
named in the config's `imports` field (imported before validation; see `import_plugins`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

from grpo_jax.errors import ConfigError


class UnknownName(ConfigError):
  """A config names an entry that no module registered."""


class Registry:
  """name -> entry (a function or a small spec object), filled by `register`."""

  def __init__(self, field: str):
    self.field = field  # the config field that selects an entry, for messages
    self._entries: dict[str, Any] = {}

  def register(self, name: str, entry: Any = None, *, replace: bool = False):
    """Adds `entry` under `name`; without `entry`, a decorator that adds the decorated object.
    Registering a taken name raises unless replace=True."""
    def add(obj):
      if name in self._entries and not replace and self._entries[name] is not obj:
        raise ValueError(f"{self.field}: {name!r} is registered already; pick another name or "
                         f"pass replace=True.")
      self._entries[name] = obj
      return obj
    return add if entry is None else add(entry)

  def unregister(self, name: str) -> None:
    self._entries.pop(name, None)

  def get(self, name: str):
    try:
      return self._entries[name]
    except KeyError:
      raise UnknownName(f"{self.field}={name!r} is unknown; valid: "
                        f"{', '.join(self.names())}.") from None

  def names(self) -> tuple[str, ...]:
    return tuple(sorted(self._entries))

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def items(self):
    return sorted(self._entries.items())


def import_plugins(spec: str, log: Callable = print) -> list[str]:
  """Imports the comma-separated modules or .py files of config.imports (their registrations
  run on import); returns their names. A path that does not exist fails in one sentence."""
  done = []
  for item in (s.strip() for s in (spec or "").split(",")):
    if not item:
      continue
    if item.endswith(".py"):
      if not os.path.isfile(item):
        raise UnknownName(f"imports: {item} is not a file (cwd {os.getcwd()}); give a path to a "
                          f".py file or an importable module name.")
      name = "grpo_jax_plugin_" + os.path.splitext(os.path.basename(item))[0]
      if name not in sys.modules:
        module_spec = importlib.util.spec_from_file_location(name, item)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
      try:
        importlib.import_module(item)
      except ModuleNotFoundError as e:
        raise UnknownName(f"imports: module {item!r} cannot be imported ({e}); give an "
                          f"importable module name or a path to a .py file.") from None
    done.append(item)
    log(f"imported {item}")
  return done
