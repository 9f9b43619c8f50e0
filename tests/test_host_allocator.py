"""grpo_jax.host_allocator: freed large blocks are reused instead of re-faulted from the kernel."""

import os
import subprocess
import sys

import pytest

# mallocs, touches (memset) and frees a 64 MiB block five times, as XLA:CPU does with a step's
# temporaries, then prints whether the settings were applied and the minor page faults of the
# last four rounds.
_PROBE = """
import ctypes, ctypes.util, resource, sys
from grpo_jax.host_allocator import tune_host_allocator
applied = tune_host_allocator() if sys.argv[1] == "tuned" else False
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def faults():
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(5):
  if i == 1:
    start = faults()
  block = libc.malloc(64 << 20)
  ctypes.memset(block, 1, 64 << 20)
  libc.free(block)
print(applied, faults() - start)
"""


def _probe(mode: str, **env) -> tuple:
  out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                       check=True, env=dict(os.environ, **env))
  applied, faults = out.stdout.split()
  return applied == "True", int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_allocator_reuses_freed_blocks_without_page_faults():
  pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")  # 16384 pages of 4 KiB per round
  applied, tuned = _probe("tuned")
  assert applied
  assert tuned < 0.05 * pages, tuned  # the block is reused: (almost) no new pages
  _, default = _probe("default")
  assert default > 3 * pages, default  # glibc's default: mmap and munmap every round
  applied, opted_out = _probe("tuned", GRPO_JAX_DEFAULT_MALLOC="1")
  assert not applied and opted_out > 3 * pages, opted_out
