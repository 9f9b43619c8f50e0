"""Rows of a task's prompt batch (a dataclass whose fields are arrays or lists, one entry per
prompt row): the rows a caller picks, and several batches as one."""

from __future__ import annotations

import dataclasses

import numpy as np


def take_rows(batch, rows):
  """The rows of a task's prompt batch (a dataclass of arrays and lists)."""
  return dataclasses.replace(batch, **{
      f.name: (getattr(batch, f.name)[rows] if isinstance(getattr(batch, f.name), np.ndarray)
               else [getattr(batch, f.name)[i] for i in rows])
      for f in dataclasses.fields(batch)})


def concat_batches(batches):
  """Prompt batches of one task (dataclasses of arrays and lists) as one, rows in order."""
  first = batches[0]
  return dataclasses.replace(first, **{
      f.name: (np.concatenate([getattr(b, f.name) for b in batches])
               if isinstance(getattr(first, f.name), np.ndarray)
               else [x for b in batches for x in getattr(b, f.name)])
      for f in dataclasses.fields(first)})
