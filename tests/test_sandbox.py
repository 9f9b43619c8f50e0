"""The python tool's sandbox against round 5's escapes (../shared/reliability/round5.md S03-S11):
each program first disables the audit hook the way the report did (it reset the write mask,
emptied the deny-lists through gc), so what refuses it is the operating system: bubblewrap's
namespaces, its read-only filesystem and the seccomp filter (grpo_jax/envs/sandbox.py). And
what a stopped or long program's output says, in each sandbox this machine has."""

import os
import subprocess
import sys
import threading

import pytest

from grpo_jax.envs.sandbox import check_sandbox, isolation_problem, run_python
from grpo_jax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_bwrap = pytest.mark.skipif(bool(isolation_problem()),
                                 reason=f"no OS sandbox here: {isolation_problem()}")
SANDBOXES = ("unisolated",) + (() if isolation_problem() else ("bubblewrap",))

# Round 5's S06 and S07 undo the hook: the write mask reset, the deny-lists emptied.
NO_HOOK = ("import gc, sys\nsys.modules['__main__']._flags = 0\n"
           "for o in gc.get_objects():\n"
           "  if isinstance(o, set) and ('os.fork' in o or '_socket' in o or 'os.remove' in o):\n"
           "    o.clear()\n")


@pytest.fixture
def outside(tmp_path):
  (tmp_path / "victim_file").write_text("keep me")
  return tmp_path


@needs_bwrap
@pytest.mark.parametrize("case,program", [
    ("S03_dirfd_write", "d = os.open(OUT, os.O_RDONLY)\n"
                        "f = os.open('dirfd.txt', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)\n"
                        "os.write(f, b'escaped')"),
    ("S04_dirfd_delete", "d = os.open(OUT, os.O_RDONLY)\nos.unlink('victim_file', dir_fd=d)"),
    ("S05_sqlite", "import sqlite3\nc = sqlite3.connect(OUT + '/sqlite.db')\n"
                   "c.execute('create table t(x)')\nc.commit()"),
    ("S06_flags_global", "f = os.open(OUT + '/flags.txt', os.O_WRONLY | os.O_CREAT)\n"
                         "os.write(f, b'x')"),
    ("S11_mkfifo_outside", "os.mkfifo(OUT + '/fifo')"),
    ("rename_outside", "os.rename(OUT + '/victim_file', OUT + '/moved')"),
])
def test_a_write_outside_its_folder_is_refused_by_the_os(outside, case, program):
  out = run_python(NO_HOOK + f"import os\nOUT = {str(outside)!r}\n" + program + "\nprint('ESCAPED')",
                   timeout_s=5.0)
  assert "ESCAPED" not in out, (case, out)
  assert "Read-only file system" in out or "unable to open database file" in out, (case, out)
  assert sorted(os.listdir(outside)) == ["victim_file"], case
  assert (outside / "victim_file").read_text() == "keep me"


@needs_bwrap
def test_no_network_no_other_processes_no_secrets():
  """S07 (the hook emptied, then fork and socket): a fork stays in the program's own PID
  namespace, which holds nothing else; every socket, loopback and Unix included, is refused;
  the trainer's environment does not reach it."""
  os.environ["GRPO_JAX_TEST_SECRET"] = "s3cret"
  try:
    out = run_python(NO_HOOK + (
        "import os, socket\n"
        "pid = os.fork()\n"
        "if pid == 0:\n  os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        f"try:\n  os.kill({os.getpid()}, 0)\n  print('SIGNALLED THE TRAINER')\n"
        "except ProcessLookupError:\n  print('no trainer')\n"
        "for family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):\n"
        "  try:\n    socket.socket(family)\n    print('SOCKET')\n"
        "  except PermissionError as e:\n    print('refused', e.errno)\n"
        "print('env', sorted(os.environ))\n"
        "print('nnp', open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])\n"),
        timeout_s=5.0)
  finally:
    del os.environ["GRPO_JAX_TEST_SECRET"]
  assert out.splitlines() == ["pids [1, 2]", "no trainer", "refused 13", "refused 13",
                              "refused 13", "env ['HOME', 'LC_CTYPE', 'PATH', 'PWD']", "nnp 1"], out
  # (LC_CTYPE is Python's own: PEP 538's locale coercion in the program's interpreter)


@needs_bwrap
def test_a_flood_of_output_is_read_bounded():
  """S10: a program writing 1 MiB blocks for its whole time limit. The trainer keeps at most
  max_output_chars of it (its peak memory grew to 11.6 GB before), and stops it on time."""
  # (VmHWM, this process's own peak: ru_maxrss would carry the pytest worker's over the exec)
  program = ("import time\nfrom grpo_jax.envs.sandbox import run_python\n"
             "start = time.perf_counter()\n"
             "out = run_python(\"import sys\\nb = 'x' * (1 << 20)\\nwhile True: "
             "sys.stdout.write(b)\", timeout_s=2.0)\n"
             "peak = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
             "print(out, round(time.perf_counter() - start, 1), int(peak) // 1024)\n")
  done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                        timeout=120, cwd=ROOT)
  said, seconds, peak_mb = done.stdout.rsplit(" ", 2)
  assert said == "Stopped: the program ran past its 2 s limit.", done.stderr[-2000:]
  assert float(seconds) < 10 and int(peak_mb) < 300, done.stdout


def test_an_unknown_sandbox_is_one_sentence():
  with pytest.raises(ConfigError, match=r"^sandbox='docker' is unknown; valid: bubblewrap, "
                     r"unisolated\.$"):
    check_sandbox("docker")


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("signal", ["SIGXCPU", "SIGKILL"])  # RLIMIT_CPU's soft, then hard
def test_a_program_killed_by_its_cpu_limit_says_so(sandbox, signal):
  """(bwrap exits 128 + the program's signal, where Python sees the program's -signal.)"""
  out = run_python(f"import signal\nsignal.raise_signal(signal.{signal})", sandbox=sandbox)
  assert out == "Stopped: the program used more than its 5 s of CPU time."


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_program_that_closes_its_output_is_still_stopped_on_time(sandbox):
  said = []
  program = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(10)"
  thread = threading.Thread(target=lambda: said.append(run_python(program, timeout_s=1.0,
                                                                  sandbox=sandbox)), daemon=True)
  thread.start()
  thread.join(5)
  assert said == ["Stopped: the program ran past its 1 s limit."]


def test_the_truncation_note_counts_the_characters_left_out():
  out = run_python("print('é' * 10000)", max_output_chars=2000, sandbox="unisolated")
  assert out == "é" * 2000 + "\n... [8001 more chars]"  # 10,000 and a newline, 2,000 shown
