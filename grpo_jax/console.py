"""A run outlives its console: standard output or error closed under it (`... | head -1` that
exited, a terminal gone under a `nohup` run, `2>&-`) must not kill it. Its record is the
workdir, so what it would have printed is dropped and the run goes on. (A closed terminal also
sends SIGHUP, which saves and stops the run like SIGTERM unless it is ignored: train/run/faults.py.)"""

from __future__ import annotations

import os
import sys


class SurvivingStream:
  """Wraps sys.stdout or sys.stderr: the first write or flush that fails (EPIPE, EIO, a closed
  file) points the file descriptor at /dev/null (so that the interpreter's flush at exit is
  quiet too) and drops everything from then on."""

  def __init__(self, stream):
    self._stream = stream
    self.closed_under_us = False

  def _drop(self) -> None:
    self.closed_under_us = True
    try:
      null = os.open(os.devnull, os.O_WRONLY)
      os.dup2(null, self._stream.fileno())
      os.close(null)
    except (OSError, ValueError, AttributeError):
      pass
    self._stream = open(os.devnull, "w")  # noqa: SIM115  (for the rest of the process)

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except UnicodeEncodeError:  # a console that cannot show a character: escape it
      encoding = getattr(self._stream, "encoding", None) or "ascii"
      return self.write(text.encode(encoding, "backslashreplace").decode(encoding))
    except (OSError, ValueError):
      self._drop()
      return len(text)

  def writelines(self, lines) -> None:
    for line in lines:
      self.write(line)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except (OSError, ValueError):
      self._drop()

  def __getattr__(self, name):
    return getattr(self._stream, name)


def survive_a_closed_console() -> None:
  """Called by the command line before the run: a standard file descriptor closed at the start
  (`2>&-`) is pointed at /dev/null, so that no file the run opens later takes its number and
  receives what is written to it (XLA's and absl's logs to fd 2); stdout and stderr become
  SurvivingStreams."""
  for fd in (0, 1, 2):
    try:
      os.fstat(fd)
    except OSError:
      null = os.open(os.devnull, os.O_RDWR)
      if null != fd:
        os.dup2(null, fd)
        os.close(null)
  for fd, name in ((1, "stdout"), (2, "stderr")):
    stream = getattr(sys, name)
    if stream is None:  # Python found the descriptor closed at its start
      stream = open(fd, "w", closefd=False)  # noqa: SIM115  (for the rest of the process)
    if not isinstance(stream, SurvivingStream):
      setattr(sys, name, SurvivingStream(stream))
