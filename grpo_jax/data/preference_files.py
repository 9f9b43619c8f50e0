"""Preference files (dpo.train_path / dpo.test_path), read and checked whole before any compute
and before anything is written to the workdir (grpo_jax/train/stages/preference.py; docs/dpo.md).

  read      `read_preference_file`: the path is a readable file, UTF-8, one JSON object per
            line; one format for the whole file, decided by its first record ({prompt, chosen,
            rejected} pairs, or KTO's unpaired {prompt, completion, label}: a record with a
            `completion` or a `label`), every line checked against it (the first line of the
            other format is named) and each field's type; at least one record; unpaired records
            only with dpo.loss='kto'. The bytes' sha256 is kept: the run record compares it on
            resume (grpo_jax/train/run/resume_guards.py).
  tokenize  `tokenize_preference_file`: every record through the task's tokenizer (a character
            it cannot encode: the file, the line and the character), each prompt within
            data.max_prompt_tokens (and, once the model is built, `check_fits_positions`: the
            longest prompt + rollout.max_new_tokens within its positions); pairs whose two
            completions are the same in the tokens training reads (both empty, identical, or
            equal in their first rollout.max_new_tokens tokens: their DPO loss stays log 2 and
            their gradient is zero) are counted, then refused or skipped
            (dpo.on_degenerate_pair; the reward model's files, rm.train_path / rm.test_path,
            which grpo_jax/train/stages/supervised.py reads here too: refused).

Each problem is one InputError (ConfigError for the loss) naming the file, the line and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import NamedTuple

from grpo_jax.data.supervised import (LabelledData, PairData, check_prompt_positions,
                                      check_prompt_tokens, encode_example, jsonl_lines)
from grpo_jax.errors import ConfigError, InputError

PAIRS, UNPAIRED = "pairs", "unpaired"
FIELD_TYPES = {  # the format's fields: (python type, what the message calls it)
    PAIRS: {"prompt": (str, "a string"), "chosen": (str, "a string"),
            "rejected": (str, "a string")},
    UNPAIRED: {"prompt": (str, "a string"), "completion": (str, "a string"),
               "label": (bool, "true or false")}}
DESCRIPTIONS = {PAIRS: "a {prompt, chosen, rejected} pair",
                UNPAIRED: "an unpaired {prompt, completion, label} record (KTO's format)"}
NEEDS = {PAIRS: "prompt, chosen and rejected strings",
         UNPAIRED: "prompt and completion strings and a boolean label (true: desirable, false: "
                   "undesirable)"}
ON_DEGENERATE_PAIR = ("refuse", "skip")


@dataclasses.dataclass(frozen=True)
class PreferenceFile:
  """One preference file, read and checked (`read_preference_file`)."""
  name: str  # the config field that gave it, e.g. "dpo.train_path"
  path: str
  format: str  # PAIRS or UNPAIRED
  records: tuple  # the JSON objects, in file order
  lines: tuple  # each record's line number
  sha256: str  # of the file's bytes

  @property
  def unpaired(self) -> bool:
    return self.format == UNPAIRED


@dataclasses.dataclass(frozen=True)
class Limits:
  """What a tokenised record must fit."""
  max_prompt_tokens: int  # data.max_prompt_tokens
  max_new_tokens: int  # rollout.max_new_tokens: completions are cut to it


class TokenizedFile(NamedTuple):
  data: object  # PairData or LabelledData
  longest_line: int  # the line of the longest prompt
  longest_tokens: int  # its tokens


def record_format(record: dict) -> str | None:
  """UNPAIRED for a record with a completion or a label, PAIRS for one with a chosen or a
  rejected completion, None for one with both kinds or neither."""
  unpaired = "completion" in record or "label" in record
  paired = "chosen" in record or "rejected" in record
  return None if unpaired == paired else (UNPAIRED if unpaired else PAIRS)


def _json_type(value) -> str:
  names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
           list: "a list", dict: "an object", type(None): "null"}
  return names.get(type(value), type(value).__name__)


def check_record(path: str, number: int, record, fmt: str, first_line: int) -> None:
  """InputError unless line `number`'s record is a JSON object of the file's format `fmt`
  (decided at `first_line`) with every field of its type."""
  if not isinstance(record, dict):
    raise InputError(f"{path} line {number} holds {_json_type(record)}, not a JSON object; "
                     f"each line needs {NEEDS[fmt]}.")
  own = record_format(record)
  if own is not None and own != fmt:
    raise InputError(f"{path} line {number} is {DESCRIPTIONS[own]}, but line {first_line} is "
                     f"{DESCRIPTIONS[fmt]}; a file holds one format: convert or remove that "
                     f"line, or put the two kinds in separate files.")
  for field, (kind, called) in FIELD_TYPES[fmt].items():
    if field not in record:
      raise InputError(f"{path} line {number} has no {field!r} field; each line of this file "
                       f"needs {NEEDS[fmt]} (line {first_line} is {DESCRIPTIONS[fmt]}).")
    value = record[field]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
      shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
      raise InputError(f"{path} line {number} has {field}={shown} ({_json_type(value)}), not "
                       f"{called}; each line needs {NEEDS[fmt]}.")


def read_preference_file(name: str, path: str, loss: str) -> PreferenceFile:
  """The checked records of config field `name`'s file `path` (module docstring, "read");
  `loss`: dpo.loss, which unpaired records need to be 'kto' (None: the reward model's file,
  pairs only)."""
  digest = hashlib.sha256()
  records, lines, fmt, first = [], [], None, 0
  either = f"{NEEDS[PAIRS]} (or, for KTO, {NEEDS[UNPAIRED].split(' (')[0]})"
  for number, record in jsonl_lines(path, either, name, digest):
    if fmt is None:
      fmt, first = (record_format(record) if isinstance(record, dict) else None) or PAIRS, number
    check_record(path, number, record, fmt, first)
    records.append(record)
    lines.append(number)
  if not records:
    raise InputError(f"{name}={path} holds no records; give one JSON object per line with "
                     f"{either}.")
  if fmt == UNPAIRED and loss != "kto":
    now, fix = ((f"dpo.loss={loss!r}", "use kto or give") if loss else
                ("the reward model trains on pairs", "give"))
    raise ConfigError(f"{name}={path!r} holds unpaired {{prompt, completion, label}} records, "
                      f"which only dpo.loss='kto' trains on ({now}); {fix} {{prompt, chosen, "
                      f"rejected}} pairs.")
  return PreferenceFile(name, path, fmt, tuple(records), tuple(lines), digest.hexdigest())


def read_preference_files(dpo) -> dict:
  """{split: PreferenceFile} of config.dpo's train_path / test_path that are set."""
  return {split: read_preference_file(f"dpo.{split}_path", dpo[f"{split}_path"], dpo.loss)
          for split in ("train", "test") if dpo[f"{split}_path"]}


def fingerprints(files: dict) -> dict:
  """{config field: {path, sha256}} of the read files, for the run record."""
  return {f.name: {"path": f.path, "sha256": f.sha256} for f in files.values()}


def check_fits_positions(f: PreferenceFile, t: TokenizedFile, max_new_tokens: int,
                         max_positions: int) -> None:
  """InputError when the file's longest prompt + rollout.max_new_tokens exceeds the model's
  max_position_embeddings (0: no limit), naming its line; once the model is built."""
  check_prompt_positions(f"{f.path} line {t.longest_line}", t.longest_tokens, max_new_tokens,
                         max_positions)


def _degenerate(f: PreferenceFile, keep: list, same: list, n: int, on_degenerate: str,
                log) -> list:
  """`keep` without the rows in `same` (the pairs whose completions are the same in the n
  tokens training reads), refused in one sentence or, with on_degenerate 'skip', logged (the
  reward model's files, which have no such option, are refused)."""
  if not same:
    return keep
  dpo = f.name.startswith("dpo.")
  empty = sum(1 for i in same if not f.records[i]["chosen"] and not f.records[i]["rejected"])
  what = (f"{len(same)} of its {len(keep)} pairs have the same chosen and rejected completion "
          f"in the {n} tokens training reads (rollout.max_new_tokens"
          f"{f'; {empty} of them both empty' if empty else ''}), the first at line "
          f"{f.lines[same[0]]}")
  if on_degenerate != "skip" or len(same) == len(keep) or not dpo:
    fix = ("fix the file" if not dpo else
           "fix the file (skipping them would leave no pairs)" if len(same) == len(keep) else
           "fix the file, or set dpo.on_degenerate_pair='skip' to train without them")
    loss = "DPO loss stays log 2" if dpo else "Bradley-Terry loss is a constant"
    raise InputError(f"{f.name}={f.path}: {what}; such pairs teach nothing (their {loss}, their "
                     f"gradient is zero): {fix}.")
  log(f"dpo: skipped pairs of {f.name}={f.path}: {what} (dpo.on_degenerate_pair='skip')")
  dropped = set(same)
  return [x for i, x in enumerate(keep) if i not in dropped]


def tokenize_preference_file(f: PreferenceFile, task, limits: Limits,
                             on_degenerate: str = "refuse", log=print) -> TokenizedFile:
  """The PairData or LabelledData of a read file (module docstring, "tokenize"; the positions:
  `check_fits_positions`)."""
  n, rows, same, longest = limits.max_new_tokens, [], [], (0, -1)
  for i, (number, r) in enumerate(zip(f.lines, f.records)):
    where = f"{f.path} line {number}"
    if f.unpaired:
      row = encode_example(task, where, r["prompt"], r["completion"], "completion")
      prompt_ids = row[0]
    else:
      prompt_ids, chosen = encode_example(task, where, r["prompt"], r["chosen"], "chosen")
      rejected = encode_example(task, where, r["prompt"], r["rejected"], "rejected")[1]
      row = ((prompt_ids, chosen), rejected)
      if chosen[:n] == rejected[:n]:
        same.append(i)
    check_prompt_tokens(where, len(prompt_ids), limits.max_prompt_tokens)
    longest = max(longest, (len(prompt_ids), -number))
    rows.append(row)
  if f.unpaired:
    data = LabelledData(rows, [r["label"] for r in f.records], n, task.pad_id)
  else:
    data = PairData.tokenized(_degenerate(f, rows, same, n, on_degenerate, log), n, task.pad_id)
  return TokenizedFile(data, -longest[1], longest[0])


def tokenize_preference_files(files: dict, task, limits: Limits, on_degenerate: str,
                              log=print) -> dict:
  """{split: TokenizedFile} of `read_preference_files`' {split: PreferenceFile}."""
  return {split: tokenize_preference_file(f, task, limits, on_degenerate, log)
          for split, f in files.items()}
