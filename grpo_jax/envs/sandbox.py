"""Running model-written Python isolated by the operating system (the "python" tool).

The policy writes these programs, thousands of them, and is rewarded for whatever works, so
the program is treated as hostile. With sandbox="bubblewrap" (the default) it runs under
bubblewrap (`bwrap`, a Debian/Ubuntu/Fedora package; Flatpak's sandbox), which the kernel
enforces, whatever the program does in Python or C:

* its own user, PID, network, IPC and UTS namespaces: it sees and signals only its own
  processes (a fresh /proc), and it has no network (a seccomp filter refuses every socket(),
  loopback and Unix sockets included, and io_uring, which could open sockets around it);
* the whole filesystem read-only (a bind mount), except its own temporary folder, removed
  afterwards; a minimal /dev;
* no_new_privs (bwrap sets it), every capability dropped, a new session (no terminal to
  inject into), and an environment of PATH and HOME only: the trainer's variables (tokens,
  API keys) never reach it;
* the limits of the process itself: a wall-time limit (the sandbox is killed, and every
  process of its PID namespace with it), CPU time (RLIMIT_CPU), address space (RLIMIT_AS),
  file size (RLIMIT_FSIZE) and no core dumps. Processes: the hook below refuses a fork, and a
  program past it forks only inside its PID namespace, all of which dies at the time limit
  (RLIMIT_NPROC is not used: it counts every thread of the trainer's user, JAX's included).

Its output (stdout, then stderr) is read as a bounded stream: at most max_output_chars are
kept, the rest is discarded as it arrives, so a program that floods its output cannot grow the
trainer's memory. Inside, `python -I -S` runs it (the standard library only) after an audit
hook (PEP 578) that turns the common accidents (a fork, a socket, a write outside the folder)
into a clear one-line refusal for the model; the hook is a courtesy, the namespaces are the
enforcement (docs/security.md lists the ways past the hook alone).

sandbox="unisolated" runs the same interpreter, hook and limits without the namespaces: only
for programs you trust, on a machine without user namespaces or bubblewrap. A machine that
cannot isolate refuses the "bubblewrap" sandbox in one sentence, before any program runs.
"""

from __future__ import annotations

import functools
import os
import platform
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

from grpo_jax.errors import ConfigError

SANDBOXES = ("bubblewrap", "unisolated")

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

# The seccomp filter (classic BPF, as bwrap --seccomp reads it): on the machine's own ABI,
# socket(), io_uring_setup/enter/register and the kernel keyring calls fail with EACCES; every
# other ABI (x32, 32-bit) is refused whole. {machine: (AUDIT_ARCH, refused syscall numbers)}.
_SECCOMP_ABI = {
    "x86_64": (0xC000003E, (41, 425, 426, 427, 248, 249, 250)),
    "aarch64": (0xC00000B7, (198, 425, 426, 427, 217, 218, 219)),
}
_RET_ALLOW, _RET_KILL, _RET_EACCES = 0x7FFF0000, 0x80000000, 0x00050000 | 13
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))  # UTF-8 bytes inside a character, not its first


def _seccomp_program() -> bytes:
  arch, refused = _SECCOMP_ABI[platform.machine()]
  ops = [(0x20, 0, 0, 4),  # A = seccomp_data.arch
         (0x15, 1, 0, arch),  # the machine's ABI: go on; else kill
         (0x06, 0, 0, _RET_KILL),
         (0x20, 0, 0, 0),  # A = seccomp_data.nr
         (0x35, len(refused) + 1, 0, 0x40000000)]  # x32's numbers (bit 30): refused
  for i, number in enumerate(refused):
    ops.append((0x15, len(refused) - i, 0, number))  # -> the EACCES return
  ops += [(0x06, 0, 0, _RET_ALLOW), (0x06, 0, 0, _RET_EACCES)]
  return b"".join(struct.pack("HBBI", *op) for op in ops)


@functools.lru_cache(maxsize=None)
def isolation_problem() -> str:
  """Why this machine cannot run the "bubblewrap" sandbox ("" when it can): bwrap missing, an
  ABI without a seccomp filter here, or user namespaces refused (tried once, cached)."""
  if shutil.which("bwrap") is None:
    return ("bubblewrap (bwrap) is not installed; install it (apt-get install bubblewrap, "
            "dnf install bubblewrap)")
  if platform.machine() not in _SECCOMP_ABI:
    return f"this sandbox has no seccomp filter for {platform.machine()}"
  try:
    probe = subprocess.run(_bwrap_args("/", None) + ["true"], capture_output=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"bwrap could not start ({type(e).__name__}: {e})"
  if probe.returncode != 0:
    why = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
    return (f"bwrap cannot create the sandbox's namespaces here ({why[0]}); allow user "
            f"namespaces (sysctl kernel.unprivileged_userns_clone=1, or in the container's "
            f"security profile)")
  return ""


def check_sandbox(sandbox: str) -> None:
  """ConfigError, in one sentence, when `sandbox` is unknown or cannot isolate here."""
  if sandbox not in SANDBOXES:
    raise ConfigError(f"sandbox={sandbox!r} is unknown; valid: {', '.join(SANDBOXES)}.")
  if sandbox == "bubblewrap" and isolation_problem():
    raise ConfigError(f"the python tool's sandbox cannot isolate its programs on this machine: "
                      f"{isolation_problem()}; or, only for programs you trust, set "
                      f"env.sandbox='unisolated' (no namespaces: the program can read, write "
                      f"and reach what your user can).")


def _bwrap_args(folder: str, seccomp_fd: int | None) -> list:
  args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
          "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
  if folder != "/":
    args += ["--bind", folder, folder, "--chdir", folder]
  if seccomp_fd is not None:
    args += ["--seccomp", str(seccomp_fd)]
  return args + ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME",
                 folder, "--"]


def _limits(memory_bytes: int, cpu_s: int, file_bytes: int):
  def apply():
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  return apply


def _read_bounded(proc, code: bytes, limit: int, deadline: float):
  """(stdout, stderr, characters discarded, timed out): the program's output until
  `deadline` (time.monotonic()), at most `limit` bytes of each stream kept, the rest read and
  dropped as it arrives (counted as UTF-8 characters: the bytes that start one)."""
  kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
  dropped = 0
  try:
    proc.stdin.write(code)
    proc.stdin.close()
  except (BrokenPipeError, OSError):
    pass  # it ended before reading its program (its output says why)
  with selectors.DefaultSelector() as selector:
    for stream in kept:
      os.set_blocking(stream.fileno(), False)
      selector.register(stream, selectors.EVENT_READ)
    while selector.get_map():
      left = deadline - time.monotonic()
      if left <= 0:
        return bytes(kept[proc.stdout]), bytes(kept[proc.stderr]), dropped, True
      for key, _ in selector.select(min(left, 0.5)):
        chunk = os.read(key.fileobj.fileno(), 1 << 16)
        if not chunk:
          selector.unregister(key.fileobj)
          continue
        buffer = kept[key.fileobj]
        room = max(limit - len(buffer), 0)
        buffer += chunk[:room]
        dropped += len(chunk[room:].translate(None, _CONTINUATION_BYTES))
  return bytes(kept[proc.stdout]), bytes(kept[proc.stderr]), dropped, False


def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512,
               max_output_chars: int = 2000, file_mb: int = 16,
               sandbox: str = "bubblewrap") -> str:
  """The program's output (stdout, then stderr), or one sentence on why it was stopped.
  ConfigError when `sandbox` cannot run here (`check_sandbox`)."""
  check_sandbox(sandbox)
  with tempfile.TemporaryDirectory(prefix="grpo_jax_sandbox_") as folder:
    folder = os.path.realpath(folder)
    python = [sys.executable, "-I", "-S", "-c", _PRELUDE]
    filter_file = None
    if sandbox == "bubblewrap":
      filter_file = tempfile.TemporaryFile()
      filter_file.write(_seccomp_program())
      filter_file.seek(0)
      command = _bwrap_args(folder, filter_file.fileno()) + python
    else:
      command = python
    try:
      proc = subprocess.Popen(
          command, cwd=folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, start_new_session=True,
          pass_fds=(filter_file.fileno(),) if filter_file else (),
          env={"PATH": "/usr/bin:/bin", "HOME": folder, "PYTHONDONTWRITEBYTECODE": "1"},
          preexec_fn=_limits(memory_mb * 2**20, int(timeout_s) + 1, file_mb * 2**20))
    finally:
      if filter_file is not None:
        filter_file.close()
    deadline = time.monotonic() + timeout_s
    out, err, dropped, timed_out = _read_bounded(proc, code.encode("utf-8", "replace"),
                                                 4 * max_output_chars, deadline)
    if not timed_out:  # (its output closed: it may still run, e.g. asleep without stdout)
      try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
      except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out:
      os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
      stream.close()
  if timed_out:
    return f"Stopped: the program ran past its {timeout_s:g} s limit."
  text = (out + err).decode(errors="replace")
  killed = {-signal.SIGXCPU, -signal.SIGKILL}
  if sandbox == "bubblewrap":  # bwrap exits 128 + the signal that killed the program
    killed |= {128 + signal.SIGXCPU, 128 + signal.SIGKILL}
  if proc.returncode in killed:
    return f"Stopped: the program used more than its {timeout_s:g} s of CPU time."
  last = err.decode(errors="replace").strip().splitlines()[-1:]
  if last and last[0].startswith("MemoryError"):
    return f"Stopped: the program ran out of its {memory_mb} MiB of memory (MemoryError)."
  if last and last[0].startswith("PermissionError: the sandbox refuses"):
    return "Refused: " + last[0].split(": ", 1)[1] + "."
  if len(text) > max_output_chars or dropped:
    more = len(text) - max_output_chars + dropped
    text = text[:max_output_chars] + f"\n... [{more} more chars]"
  return text if text else "(no output)"
