"""Rows of a task's prompt batch (a dataclass whose fields are arrays or lists, one entry per
prompt row): the rows a caller picks, and several batches as one."""

from __future__ import annotations

import dataclasses

import numpy as np


def _rows_of(value, rows):
  if value is None:  # a field the batch does not carry (a text table's pixel_values)
    return None
  return value[rows] if isinstance(value, np.ndarray) else [value[i] for i in rows]


def take_rows(batch, rows):
  """The rows of a task's prompt batch (a dataclass of arrays and lists; None fields stay
  None)."""
  return dataclasses.replace(batch, **{
      f.name: _rows_of(getattr(batch, f.name), rows) for f in dataclasses.fields(batch)})


def _joined(values: list):
  if values[0] is None:
    return None
  if isinstance(values[0], np.ndarray):
    return np.concatenate(values)
  return [x for v in values for x in v]


def concat_batches(batches):
  """Prompt batches of one task (dataclasses of arrays and lists; None fields stay None) as
  one, rows in order."""
  return dataclasses.replace(batches[0], **{
      f.name: _joined([getattr(b, f.name) for b in batches])
      for f in dataclasses.fields(batches[0])})
