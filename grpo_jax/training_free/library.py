"""Training-Free GRPO's experience library (arXiv 2510.08191; docs/training_free_grpo.md) as pure
functions on plain dicts {id: lesson}, insertion order being the library's order.

One step's update, as the authors' math pipeline does it:

  1. each kept group (0 < mean correctness < 1) yields at most one operation from its critique,
     {"option": "add", "experience"} or {"option": "modify", "experience", "modified_from"};
  2. `collect_candidates`: the adds enter the library as C0, C1, ...; the modifies that name an
     id present at that point wait for the batch revision;
  3. `apply_revision`: the revision plan's {"option": "modify", "experience", "modified_from"}
     replaces a text, {"option": "merge", "experience", "merged_from": [ids]} removes the ids
     and adds the merged text as the next C id (a merge naming an id the library does not
     hold is skipped whole, as the authors' is: a made-up id must not cost the real lessons);
  4. `renumber`: the ids become G0 .. Gn-1.

Operations that are not dicts, have an unknown option, lack a field or name an id the library
does not hold are skipped and counted (`OperationCounts`), never raised: they are a language
model's output. One difference from the authors' code, decided here: a revision `modify` of an
unknown id is skipped, where theirs would add the text under that id.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class OperationCounts:
  """How many operations of one update were applied and skipped."""

  added: int = 0
  modified: int = 0
  merged: int = 0
  skipped: int = 0

  def __add__(self, other: "OperationCounts") -> "OperationCounts":
    return OperationCounts(*(a + b for a, b in zip(dataclasses.astuple(self),
                                                    dataclasses.astuple(other))))


def render(library: dict) -> str:
  """The library as the prompts show it: one "[id]. lesson" line each, or "None"."""
  return "\n".join(f"[{i}]. {text}" for i, text in library.items()) or "None"


def problem_prompt(template: str, problem: str, library: dict) -> str:
  """The user turn: the bare problem with an empty library, else the template around both."""
  return template.format(problem=problem, experiences=render(library)) if library else problem


def last_json_list(text: str) -> Optional[list]:
  """The JSON list after the last ```json fence (to the next fence), or None when it does not
  parse as a list."""
  body = text.split("```json")[-1].split("```")[0]
  try:
    value = json.loads(body)
  except (ValueError, RecursionError):  # RecursionError: lists nested past the parser's depth
    return None
  return value if isinstance(value, list) else None


def _text(op: Any, option: str, *fields: str) -> bool:
  """op is a dict with this option, a string experience and the named fields."""
  return (isinstance(op, dict) and op.get("option") == option
          and isinstance(op.get("experience"), str) and all(f in op for f in fields))


def _modifies(op: Any, entries: dict) -> bool:
  """op is a modify of one of `entries` (its modified_from a string naming one of them)."""
  return (_text(op, "modify", "modified_from") and isinstance(op["modified_from"], str)
          and op["modified_from"] in entries)


def collect_candidates(library: dict, operations: list) -> tuple[dict, list, int, OperationCounts]:
  """Step 2: (candidates, modifies waiting for the revision, the next C number, counts)."""
  candidates, waiting, next_id, skipped = dict(library), [], 0, 0
  for op in operations:
    if _text(op, "add"):
      candidates[f"C{next_id}"] = op["experience"]
      next_id += 1
    elif _modifies(op, candidates):
      waiting.append(op)
    else:
      skipped += 1
  return candidates, waiting, next_id, OperationCounts(added=next_id, skipped=skipped)


def apply_revision(candidates: dict, plan: list, next_id: int) -> tuple[dict, OperationCounts]:
  """Step 3: the candidates after the revision plan's modifies and merges."""
  library, modified, merged, skipped = dict(candidates), 0, 0, 0
  for op in plan:
    if _modifies(op, library):
      library[op["modified_from"]] = op["experience"]
      modified += 1
    elif (_text(op, "merge", "merged_from") and isinstance(op["merged_from"], list)
          and all(isinstance(i, str) and i in library for i in op["merged_from"])):
      for i in op["merged_from"]:
        library.pop(i, None)
      library[f"C{next_id}"] = op["experience"]
      next_id, merged = next_id + 1, merged + 1
    else:
      skipped += 1
  return library, OperationCounts(modified=modified, merged=merged, skipped=skipped)


def renumber(library: dict) -> dict:
  """Step 4: ids G0 .. Gn-1 in the library's order."""
  return {f"G{i}": text for i, text in enumerate(library.values())}


def kept_groups(correct) -> list[bool]:
  """Per group (rows of G 0/1 correctness): True when some but not all rows are correct."""
  return [0 < sum(map(bool, row)) < len(row) for row in correct]
