"""One filesystem layer for what a run writes under its workdir (config, run record, metrics,
samples, evaluation reports, the lock, checkpoint checksums, the exported checkpoint):
etils.epath, as orbax does, so that a gs:// (or s3://, any fsspec URI) workdir works like a
local folder. Checkpoints themselves are orbax's, which writes such URIs itself.

Object stores cannot append to or rename an object, but each write of a whole object is atomic
there. So on a URI `append` rewrites the object with its new lines (a run's own records are
small) and `write_atomic` writes the object in one go; a local path keeps the POSIX way
(append; write beside, fsync, rename). gs:// needs gcsfs (pip install gcsfs), s3:// s3fs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from etils import epath


def path(base, *parts) -> epath.Path:
  return epath.Path(base).joinpath(*parts)


def is_uri(p) -> bool:
  """Whether `p` is an object-store URI (gs://bucket/...) rather than a local path."""
  return "://" in str(p)


def exists(p) -> bool:
  return epath.Path(p).exists()


def makedirs(p) -> None:
  epath.Path(p).mkdir(parents=True, exist_ok=True)


def read_text(p, errors: str = "strict") -> str | None:
  """The file's text, or None when it does not exist. errors="replace" (a file of records, one
  a line): bytes that are not UTF-8 read as U+FFFD, so that their line is what the reader
  leaves out, not the file."""
  p = epath.Path(p)
  return p.read_bytes().decode("utf-8", errors=errors) if p.exists() else None


def write_atomic(p, text: str) -> None:
  """Replaces the file's content with `text` so that a reader (or a kill) never sees half of
  it."""
  p = epath.Path(p)
  if is_uri(p):
    p.write_text(text)
    return
  partial = f"{p}.tmp"
  with open(partial, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(partial, p)


def append(p, text: str) -> None:
  """Adds `text` at the end of the file (created if absent)."""
  p = epath.Path(p)
  if is_uri(p):
    p.write_text((read_text(p) or "") + text)
    return
  with open(p, "a") as f:
    f.write(text)


@contextlib.contextmanager
def local_folder(out: str):
  """A local folder to write the folder `out` into: `out` itself, or (a URI) a temporary folder
  uploaded to it afterwards (upload_folder), for writers of local files only (safetensors)."""
  if not is_uri(out):
    yield out
    return
  with tempfile.TemporaryDirectory() as folder:
    yield folder
    upload_folder(folder, out)


def upload_folder(local: str, target) -> None:
  """Makes `target`, a URI folder, hold the files of a local folder: each copied, and the files
  directly in target that the local folder lacks removed (an earlier export's weight shards
  would otherwise stand beside the new ones)."""
  target = epath.Path(target)
  written = set()
  for root, _, names in os.walk(local):
    for name in names:
      relative = os.path.relpath(os.path.join(root, name), local)
      written.add(relative)
      (target / relative).parent.mkdir(parents=True, exist_ok=True)
      (target / relative).write_bytes(epath.Path(local, relative).read_bytes())
  for old in target.iterdir():
    if old.name not in written and old.is_file():
      old.unlink()
