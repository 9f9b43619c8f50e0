"""The python tool's cost per call, isolated by the OS (sandbox="bubblewrap", issue 77) against
the interpreter alone (sandbox="unisolated", the hook and limits only: the tool before issue
77). Both in one invocation, interleaved call by call, so that the machine's load falls on both
alike; a warm-up call of each first.

    python benchmarks/sandbox_cost.py [--calls 200]

Prints one JSON line per sandbox with the keys sandbox, calls, median_ms, p99_ms, then one with
the added median and p99.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import header  # noqa: E402
import warnings  # noqa: E402
warnings.filterwarnings("ignore", message="os.fork")  # (header imports jax; the sandbox forks)
from grpo_jax.envs.sandbox import run_python  # noqa: E402

PROGRAM = "print(sum(i * i for i in range(1000)))"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=200)
  args = parser.parse_args()
  print(header())
  sandboxes = ("unisolated", "bubblewrap")
  times = {s: [] for s in sandboxes}
  for s in sandboxes:
    assert run_python(PROGRAM, sandbox=s) == "332833500\n"
  for _ in range(args.calls):
    for s in sandboxes:
      start = time.perf_counter()
      out = run_python(PROGRAM, sandbox=s)
      times[s].append(1000 * (time.perf_counter() - start))
      assert out == "332833500\n", out
  rows = {}
  for s in sandboxes:
    ordered = sorted(times[s])
    rows[s] = dict(sandbox=s, calls=args.calls, median_ms=round(statistics.median(ordered), 1),
                   p99_ms=round(ordered[int(0.99 * (len(ordered) - 1))], 1))
    print(json.dumps(rows[s]))
  print(json.dumps(dict(added_median_ms=round(rows["bubblewrap"]["median_ms"]
                                              - rows["unisolated"]["median_ms"], 1),
                        added_p99_ms=round(rows["bubblewrap"]["p99_ms"]
                                           - rows["unisolated"]["p99_ms"], 1))))


if __name__ == "__main__":
  main()
