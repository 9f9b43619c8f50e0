"""Reading the rows of task.name="table" (grpo_jax/data/table.py): a .jsonl, .json, .parquet or
.csv file, a folder of them, a `datasets` save_to_disk folder or a hub id, each row as (where,
row dict or BadRow), `where` naming its file and line (or item / row number) for one-sentence
errors."""

from __future__ import annotations

import collections
import csv
import json
import os

from grpo_jax.unicode_text import lone_surrogate, surrogate_sentence
from grpo_jax.errors import InputError, first_line, json_limit

EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv")


class BadRow(Exception):
  """A row that cannot be used; the message says why, `kind` (the message without its
  details) is what skipped rows are counted by."""

  def __init__(self, message: str, kind: str = ""):
    super().__init__(message)
    self.kind = kind or message.split(" (")[0].split(";")[0]


class LongPrompt(BadRow):
  """A prompt longer than data.max_prompt_tokens."""


def jsonl_rows(path: str):
  """(where "file:line", row dict or BadRow) of a .jsonl file (a UTF-8 BOM at its start
  allowed), blank lines skipped, each row's text checked (`_checked`)."""
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      where = f"{path}:{number}"
      try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
      except UnicodeDecodeError as e:
        yield where, BadRow(f"is not UTF-8 text (byte {raw[e.start:e.start + 1]!r} at column "
                            f"{e.start + 1}); save the file as UTF-8")
        continue
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        yield where, BadRow(f"is not valid JSON ({e.msg}); each line must be one object")
        continue
      except (ValueError, RecursionError) as e:  # valid JSON that Python's json cannot read
        yield where, BadRow(json_limit(e))
        continue
      yield from _checked([(where, row if isinstance(row, dict) else BadRow(
          "is not a JSON object; each line must be one object"))])


_MISSING, _EXTRA = object(), "\x00extra"  # a CSV row with fewer / more fields than its header


def _checked(rows):
  """`rows` with every row whose text is not valid Unicode (a lone surrogate) made a BadRow:
  the tokenizer cannot encode it, and the error must name the file and line, not the
  tokenizer."""
  for where, row in rows:
    found = None if isinstance(row, BadRow) else lone_surrogate(row)
    yield where, row if found is None else BadRow(surrogate_sentence(found),
                                                  "rows with text that is not valid Unicode")


def _file_rows(path: str):
  """(where, row dict or BadRow) of one file, each row's text checked (`_checked`)."""
  if os.path.splitext(path)[1] == ".jsonl":
    yield from jsonl_rows(path)
  else:
    yield from _checked(_other_file_rows(path))


def _other_file_rows(path: str):
  """(where, row dict or BadRow) of a .json, .csv or .parquet file (a text file may start with a
  UTF-8 BOM, as Excel's "CSV UTF-8" does)."""
  ext = os.path.splitext(path)[1]
  try:
    if ext == ".json":
      with open(path, encoding="utf-8-sig") as f:
        rows = json.load(f)
      if not isinstance(rows, list):
        raise InputError(f"{path} holds a JSON {type(rows).__name__}; a .json data file must be "
                         f"a list of objects (or use .jsonl, one object per line).")
      for i, row in enumerate(rows):
        yield f"{path} item {i}", row if isinstance(row, dict) else BadRow("is not an object")
    elif ext == ".csv":
      with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f, restval=_MISSING, restkey=_EXTRA)
        counts = collections.Counter(n for n in reader.fieldnames or () if n)  # ("" may repeat)
        twice = next((n for n, count in counts.items() if count > 1), None)
        if twice is not None:
          raise InputError(f"{path} names the column {twice!r} twice in its header, so only "
                           f"the last would be read; rename or remove one of them.")
        for row in reader:
          where = f"{path}:{reader.line_num}"
          if _EXTRA in row or _MISSING in row.values():
            given = len(row) - (_EXTRA in row) - sum(v is _MISSING for v in row.values())
            given += len(row.get(_EXTRA, ()))
            yield where, BadRow(f"has {given} fields where the header names "
                                f"{len(reader.fieldnames)}; give every row the header's fields")
          else:
            yield where, dict(row)
    else:  # .parquet
      import pyarrow.parquet as pq  # noqa: PLC0415  (datasets' dependency)
      for i, row in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path} row {i}", row
  except RecursionError:
    raise InputError(f"{path} is nested too deeply to read as {ext}; flatten its lists and "
                     f"objects.") from None
  except UnicodeDecodeError as e:
    raise InputError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                     f"UTF-8.") from None
  except (ValueError, OSError, ImportError) as e:
    if isinstance(e, InputError):
      raise
    raise InputError(f"{path} cannot be read as {ext} ({first_line(e)}); check the file.") from None


def _dataset_rows(dataset, name: str):
  yield from _checked((f"{name} row {i}", dict(row)) for i, row in enumerate(dataset))


def read_splits(source: str, train_split: str, test_split: str, subset: str = ""):
  """(train rows, test rows or None): lists of (where, row or BadRow), by the module's rules."""
  if os.path.isfile(source):
    if os.path.splitext(source)[1] not in EXTENSIONS:
      raise InputError(f"data.source={source!r} is not a {', '.join(EXTENSIONS)} file; convert "
                       f"it, or point data.source at a folder or a datasets hub id.")
    return list(_file_rows(source)), None
  if os.path.isdir(source):
    if any(os.path.isfile(os.path.join(source, f)) for f in ("dataset_dict.json", "state.json")):
      import datasets  # noqa: PLC0415
      loaded = datasets.load_from_disk(source)
      if isinstance(loaded, datasets.Dataset):
        return list(_dataset_rows(loaded, source)), None
      splits = loaded
    else:
      def find(split):
        for ext in EXTENSIONS:
          path = os.path.join(source, split + ext)
          if os.path.isfile(path):
            return list(_file_rows(path))
        return None
      train = find(train_split)
      if train is None:
        raise InputError(f"data.source={source!r} has no {train_split}{{{','.join(EXTENSIONS)}}} "
                         f"(data.train_split={train_split!r}); add the file or point "
                         f"data.source at one.")
      return train, find(test_split)
  elif source.endswith(EXTENSIONS) or source.startswith(("/", ".", "~")):
    raise InputError(f"data.source={source!r} does not exist (cwd {os.getcwd()}); give the path "
                     f"of a {'/'.join(EXTENSIONS)} file or of a folder.")
  else:
    try:
      import datasets  # noqa: PLC0415
      splits = datasets.load_dataset(source, subset or None)
    except Exception as e:  # noqa: BLE001  offline, unknown id, ...: one sentence
      raise InputError(f"data.source={source!r} is not a local file or folder, and loading it "
                       f"as a datasets hub id failed ({first_line(e)}); check the path or id, "
                       f"or save the dataset to a folder and point data.source at it.") from None
  if train_split not in splits:
    raise InputError(f"data.source={source!r} has splits {sorted(splits)}, not "
                     f"data.train_split={train_split!r}; set data.train_split.")
  test = splits[test_split] if test_split in splits else None
  return (list(_dataset_rows(splits[train_split], f"{source}[{train_split}]")),
          None if test is None else list(_dataset_rows(test, f"{source}[{test_split}]")))
