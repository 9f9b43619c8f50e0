"""Training-Free GRPO's checkpoints: the library after step k is DIR/library/step_k.json,
{"step": k, "library": {id: lesson}} (train/run/files.py: local or gs://, written atomically),
and the summariser's prompts and replies of that step DIR/library/calls_k.json.

Resuming takes the newest step file that reads as a library, like the RL stage's newest
checkpoint that restores: a damaged newer one (cut short, not JSON, not a library) is named in
one warning line and moved aside to step_k.json.unreadable, and the resumed run writes that
step again. When no step file reads, the run stops in one sentence naming the newest one,
before any compute. Files of the folder whose names are not step_<k>.json (notes, copies such
as step_2.json.bak, the .unreadable ones) are not library files and are left alone.
"""

from __future__ import annotations

import dataclasses
import json
import re

from grpo_jax.errors import InputError, first_line, json_limit
from grpo_jax.train.run import files

STEP_FILE = re.compile(r"step_(0|[1-9][0-9]*)\.json")


class NotALibrary(ValueError):
  """A step file that parses as JSON but does not hold a library."""


@dataclasses.dataclass(frozen=True)
class LibraryState:
  step: int
  library: dict


@dataclasses.dataclass(frozen=True)
class Damaged:
  """A step file that does not read as a library, and why."""
  step: int
  reason: str


class LibraryFiles:
  """The loop skeleton's checkpoints for a library (module docstring)."""

  def __init__(self, workdir: str):
    self.directory = files.path(workdir, "library")

  def _write(self, name: str, value) -> None:
    files.makedirs(self.directory)
    files.write_atomic(self.directory / name, json.dumps(value, indent=1))

  def save(self, state: LibraryState) -> None:
    self._write(f"step_{state.step}.json", {"step": state.step, "library": state.library})

  def save_calls(self, step: int, calls: list) -> None:
    """The summariser's prompts and replies of a step, for reading: DIR/library/calls_k.json."""
    self._write(f"calls_{step}.json", calls)

  def steps(self) -> list[int]:
    """The steps of the folder's step_<k>.json files, oldest first (other names ignored)."""
    if not files.exists(self.directory):
      return []
    found = (STEP_FILE.fullmatch(p.name) for p in self.directory.glob("step_*.json"))
    return sorted(int(m.group(1)) for m in found if m)

  def read(self, step: int) -> LibraryState:
    """The library of step_<step>.json; ValueError (JSONDecodeError, NotALibrary) or OSError
    saying what is wrong."""
    text = files.read_text(self.directory / f"step_{step}.json")
    if text is None:
      raise NotALibrary("it is gone")
    try:
      data = json.loads(text)
    except json.JSONDecodeError:
      raise
    except (ValueError, RecursionError) as e:  # valid JSON that Python's json cannot read
      raise NotALibrary(f"it {json_limit(e, fix=False)}") from None
    if not isinstance(data, dict) or data.get("step") != step:
      raise NotALibrary(f'it does not hold {{"step": {step}, "library": ...}}')
    library = data.get("library")
    if not isinstance(library, dict) or not all(isinstance(v, str) for v in library.values()):
      raise NotALibrary("its library is not a JSON object of {id: lesson text}")
    return LibraryState(step, dict(library))

  def newest(self) -> tuple[LibraryState | None, list[Damaged]]:
    """(the newest library that reads, or None when there is no step file; the damaged step
    files newer than it). InputError when there are step files and none reads."""
    damaged = []
    for step in reversed(self.steps()):
      try:
        return self.read(step), damaged
      except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        reason = str(e) if isinstance(e, NotALibrary) else first_line(e, 120)
        damaged.append(Damaged(step, reason))
    if damaged:
      newest = damaged[0]
      raise InputError(f"{self.directory}/step_{newest.step}.json cannot be read as a library "
                       f"({newest.reason}), nor can any older step file of that folder; restore "
                       f"it, delete the folder's step_*.json files to start the library over, "
                       f"or pass another --workdir.")
    return None, []

  def set_aside(self, damaged: list[Damaged], resumed_step: int, log=print) -> None:
    """Moves the damaged step files newer than the resumed one to step_k.json.unreadable
    (step_k.json.unreadable1, ... when taken), each named in one warning line."""
    for bad in damaged:
      source = self.directory / f"step_{bad.step}.json"
      target, n = self.directory / f"step_{bad.step}.json.unreadable", 1
      while target.exists():
        target, n = self.directory / f"step_{bad.step}.json.unreadable{n}", n + 1
      source.rename(target)
      log(f"warning: {source} cannot be read as a library ({bad.reason}); resuming from "
          f"step_{resumed_step}.json, and it was moved to {target.name}.")
