"""Running model-written Python in a subprocess sandbox (the "python" tool).

The program runs in a fresh interpreter (`python -I -S`: no site-packages, no PYTHONPATH, so
nothing of the parent, grpo_jax included, is importable; the standard library is) in a
temporary folder removed afterwards, under:

* a wall-time limit (the process group is killed) and a CPU-time limit (RLIMIT_CPU);
* an address-space limit (RLIMIT_AS: a large allocation raises MemoryError) and a file-size
  limit (RLIMIT_FSIZE);
* an audit hook (PEP 578), installed before the program runs and not removable by it, that
  refuses new processes (fork, exec, spawn, subprocess), sockets and native-code loading
  (the _socket, _posixsubprocess and ctypes modules), signals to other processes, and any write,
  rename or delete outside the folder.

Its output (stdout then stderr) is truncated to max_output_chars. This guards against a
model's accidents and loops, not against a determined attacker with a kernel exploit: run
untrusted code in a container as well.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile

_PRELUDE = r'''
import os as _os, sys as _sys
_root = _os.path.realpath(_os.getcwd())
_deny = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
         "subprocess.Popen", "socket.__new__", "socket.connect", "socket.bind", "ctypes.dlopen",
         "os.kill", "os.killpg", "pty.spawn", "os.chroot", "sys.addaudithook"}
_modules = {"_socket", "socket", "_posixsubprocess", "ctypes", "_ctypes", "multiprocessing",
            "_multiprocessing", "subprocess", "pty"}
_writes = {"os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
           "os.chmod", "os.chown", "shutil.rmtree", "os.rename", "os.utime"}
_flags = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC | _os.O_APPEND
def _inside(path, _os=_os, _root=_root):
  if isinstance(path, int):
    return True
  path = _os.path.realpath(_os.fsdecode(path))
  return path == _root or path.startswith(_root + _os.sep)
def _hook(event, args, _deny=_deny, _modules=_modules, _writes=_writes, _inside=_inside):
  if event in _deny:
    raise PermissionError(f"the sandbox refuses {event} (no processes, sockets or signals)")
  if event == "import" and args[0].split(".")[0] in _modules:
    raise PermissionError(f"the sandbox refuses to import {args[0]} (no processes, sockets or "
                          f"native code)")
  if event == "open" and ((args[1] and any(c in args[1] for c in "wax+"))
                          or (args[2] or 0) & _flags) and not _inside(args[0]):
    raise PermissionError(f"the sandbox refuses to write {args[0]} (only its own folder)")
  if event in _writes and not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
    raise PermissionError(f"the sandbox refuses {event} outside its own folder")
_sys.addaudithook(_hook)
del _os, _sys, _hook, _inside
__code = __import__("sys").stdin.read()
exec(compile(__code, "<program>", "exec"), {"__name__": "__main__"})
'''


def _limits(memory_bytes: int, cpu_s: int, file_bytes: int):
  def apply():
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  return apply


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512,
               max_output_chars: int = 2000, file_mb: int = 16) -> str:
  """The program's output (stdout, then stderr), or one sentence on why it was stopped."""
  with tempfile.TemporaryDirectory(prefix="grpo_jax_sandbox_") as folder:
    try:
      proc = subprocess.Popen(
          [sys.executable, "-I", "-S", "-c", _PRELUDE], cwd=folder, stdin=subprocess.PIPE,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
          env={"PATH": "/usr/bin:/bin", "HOME": folder, "PYTHONDONTWRITEBYTECODE": "1"},
          preexec_fn=_limits(memory_mb * 2**20, int(timeout_s) + 1, file_mb * 2**20))
      out, err = proc.communicate(code.encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
      return f"Stopped: the program ran past its {timeout_s:g} s limit."
  text = (out + err).decode(errors="replace")
  if proc.returncode == -signal.SIGXCPU or proc.returncode == -signal.SIGKILL:
    return f"Stopped: the program used more than its {timeout_s:g} s of CPU time."
  last = err.decode(errors="replace").strip().splitlines()[-1:]
  if last and last[0].startswith("MemoryError"):
    return f"Stopped: the program ran out of its {memory_mb} MiB of memory (MemoryError)."
  if last and last[0].startswith("PermissionError: the sandbox refuses"):
    return "Refused: " + last[0].split(": ", 1)[1] + "."
  if len(text) > max_output_chars:
    text = text[:max_output_chars] + f"\n... [{len(text) - max_output_chars} more chars]"
  return text if text else "(no output)"
