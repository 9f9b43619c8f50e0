"""Named registries: advantage estimators, policy losses, KL estimators, rewards, tasks and
model families each register under the name a config uses, in the module that defines them.

    ESTIMATORS = Registry("rl.advantage")

    @ESTIMATORS.register("my_estimator")
    def my_estimator(inputs): ...

Config validation lists `registry.names()`; `registry.get(name)` fails with one sentence naming
the field, the value and the valid names. A researcher's own entries live in their own file,
named in the config's `imports` field (imported before validation; see `import_plugins`).

An entry declares its hyperparameters as its keyword-only parameters, with their defaults, and
may register a `check` on them; `bind` fills them from the config section of the same names
when the entry is built (optax style), so the maths receive values, never the config:

    @POLICY_LOSSES.register("ppo_clip", check=check_clip)
    def ppo_clip(logp, old_logp, advantages, mask, *, clip_eps_low=0.2, clip_eps_high=0.2): ...

The section's defaults for these fields are the entries' own (`hyperparameters`, collected by
grpo_jax/defaults.py); a field the section lacks (a plugin's new one) takes the entry's default.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable

from grpo_jax.errors import ConfigError, first_line


class UnknownName(ConfigError):
  """A config names an entry that no module registered."""


class Registry:
  """name -> entry (a function or a small spec object), filled by `register`."""

  def __init__(self, field: str):
    self.field = field  # the config field that selects an entry, for messages
    self._entries: dict[str, Any] = {}
    self._checks: dict[str, Callable] = {}

  def register(self, name: str, entry: Any = None, *, replace: bool = False,
               check: Callable | None = None):
    """Adds `entry` under `name`; without `entry`, a decorator that adds the decorated object.
    check(**hyperparameters) -> None or the one sentence saying what is wrong (see `bind`).
    Registering a taken name raises unless replace=True."""
    def add(obj):
      if name in self._entries and not replace and self._entries[name] is not obj:
        raise ValueError(f"{self.field}: {name!r} is registered already; pick another name or "
                         f"pass replace=True.")
      if _JOURNAL is not None:
        _JOURNAL.append((self, name, self._entries.get(name, _ABSENT),
                         self._checks.get(name, _ABSENT), _registering_module()))
      self._entries[name] = obj
      self._checks.pop(name, None)
      if check is not None:
        self._checks[name] = check
      return obj
    return add if entry is None else add(entry)

  def unregister(self, name: str) -> None:
    self._entries.pop(name, None)
    self._checks.pop(name, None)

  def _restore(self, name: str, entry: Any, check: Any) -> None:
    """`name`'s entry and check as they were (_ABSENT: none), undoing a registration."""
    for table, value in ((self._entries, entry), (self._checks, check)):
      if value is _ABSENT:
        table.pop(name, None)
      else:
        table[name] = value

  def bind(self, name: str, section, fn: Callable | None = None) -> Callable:
    """Entry `name` (or `fn`, its function) with its hyperparameters bound from `section`,
    after its registered check: raises ConfigError (one sentence) on a bad value."""
    fn = self.get(name) if fn is None else fn
    values = {k: section[k] if k in section else default
              for k, default in hyperparameters(fn).items()}
    why = self._checks[name](**values) if name in self._checks else None
    if why:
      raise ConfigError(why)
    return functools.partial(fn, **values) if values else fn

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


_ABSENT = object()
# (registry, name, previous entry, previous check, registering module) of each registration
# while import_plugins imports a module; None otherwise.
_JOURNAL: list | None = None


def _registering_module() -> str | None:
  """__name__ of the module whose top-level code is running the registration."""
  frame = sys._getframe(2)
  while frame is not None and frame.f_code.co_name != "<module>":
    frame = frame.f_back
  return None if frame is None else frame.f_globals.get("__name__")


@contextlib.contextmanager
def _undone_on_error():
  """When the block (a plugin's import) raises, the registrations made by the modules that
  failed with it (gone from sys.modules, as Python leaves a module that raised on import) are
  undone, newest first; those of modules it imported that succeeded stay, as those modules do.
  Without this, the fixed plugin imported again in the same process finds its names taken."""
  global _JOURNAL
  outer, _JOURNAL = _JOURNAL, []
  try:
    yield
  except BaseException:
    for registry, name, entry, check, module in reversed(_JOURNAL):
      if module is None or module not in sys.modules:
        registry._restore(name, entry, check)
    raise
  finally:
    _JOURNAL = outer


def hyperparameters(fn: Callable) -> dict[str, Any]:
  """fn's hyperparameters: its keyword-only parameters and their defaults (each needs one)."""
  out = {p.name: p.default for p in inspect.signature(fn).parameters.values()
         if p.kind is inspect.Parameter.KEYWORD_ONLY}
  missing = [k for k, v in out.items() if v is inspect.Parameter.empty]
  if missing:
    raise ValueError(f"{fn.__qualname__}: hyperparameter(s) {', '.join(missing)} need a default.")
  return out


def declared_defaults(fns, section: dict) -> dict:
  """The section's fields `section` plus the hyperparameters of the entries `fns`, each field
  with one default: two owners declaring different defaults for one field raise."""
  out = dict(section)
  for fn in fns:
    for name, default in hyperparameters(fn).items():
      if name in out and out[name] != default:
        raise ValueError(f"{fn.__qualname__} declares {name}={default!r}, but its section's "
                         f"default is {out[name]!r}; one field has one default.")
      out[name] = default
  return out


def load_file_module(path: str):
  """The module of a .py file, imported once per file (sys.modules, named by its absolute
  path, so two files of one name stay apart); a file that raises on import is not kept."""
  path = os.path.abspath(path)
  name = ("grpo_jax_file_" + os.path.splitext(os.path.basename(path))[0] + "_"
          + hashlib.sha1(path.encode()).hexdigest()[:8])
  if name not in sys.modules:
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
      module_spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[name]
      raise
  return sys.modules[name]


def import_plugins(spec: str, log: Callable = print) -> list[str]:
  """Imports the comma-separated modules or .py files of config.imports (their registrations
  run on import); returns their names. A path that does not exist fails in one sentence; so
  does a module that raises, and whatever it registered before raising is taken out again."""
  done = []
  for item in (s.strip() for s in (spec or "").split(",")):
    if not item:
      continue
    if item.endswith(".py"):
      if not os.path.isfile(item):
        raise UnknownName(f"imports: {item} is not a file (cwd {os.getcwd()}); give a path to a "
                          f".py file or an importable module name.")
      try:
        with _undone_on_error():
          load_file_module(item)
      except (Exception, SystemExit) as e:  # noqa: BLE001  a researcher's module may raise
        # anything, sys.exit(0) included, which must not end the run as a success
        raise UnknownName(f"imports: {item} raised {first_line(e)} while being imported; fix "
                          f"that file.") from None
    else:
      try:
        with _undone_on_error():
          importlib.import_module(item)
      except ModuleNotFoundError as e:
        if e.name is not None and item != e.name and not item.startswith(f"{e.name}."):
          raise UnknownName(f"imports: module {item!r} could not be imported: it imports "
                            f"{e.name!r}, which is not installed; install it or fix that "
                            f"module.") from None
        raise UnknownName(f"imports: module {item!r} cannot be imported ({e}); give an "
                          f"importable module name or a path to a .py file.") from None
      except (Exception, SystemExit) as e:  # noqa: BLE001
        raise UnknownName(f"imports: module {item!r} raised {first_line(e)} while being "
                          f"imported; fix that module.") from None
    done.append(item)
    log(f"imported {item}")
  return done
