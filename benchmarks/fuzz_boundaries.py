"""The fuzz harness's long profile (issue 77): tests/test_fuzz_boundaries.py with 10,000
generated inputs per boundary (GRPO_JAX_FUZZ=long, not derandomised: a new draw every run), the
CI profile's 200 derandomised ones aside.

    python benchmarks/fuzz_boundaries.py

Prints one JSON line per boundary with the keys boundary, passing_examples, failing_examples (0:
the boundary either accepted every input or refused it with the project's own error), invalid
(draws hypothesis discarded), seconds, then a summary line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import header  # noqa: E402


def main() -> None:
  print(header())
  start = time.perf_counter()
  out = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
       "--hypothesis-show-statistics", "tests/test_fuzz_boundaries.py"],
      cwd=ROOT, capture_output=True, text=True, env={**os.environ, "GRPO_JAX_FUZZ": "long"})
  text = out.stdout + out.stderr
  failed = set(re.findall(r"FAILED tests/test_fuzz_boundaries.py::(\w+)", text))
  rows = []
  for block in re.split(r"\n(?=tests/test_fuzz_boundaries.py::)", text):
    name = re.match(r"tests/test_fuzz_boundaries.py::(\w+)", block)
    counts = re.search(r"(\d+) passing, (\d+) failing, and (\d+) invalid", block)
    if name and counts:
      seconds = re.search(r"phase \(([\d.]+) seconds\)", block)
      rows.append(dict(boundary=name.group(1), passing_examples=int(counts.group(1)),
                       failing_examples=int(counts.group(2)), invalid=int(counts.group(3)),
                       seconds=float(seconds.group(1)) if seconds else None))
      print(json.dumps(rows[-1]))
  print(json.dumps(dict(boundaries=len(rows), examples=sum(r["passing_examples"] for r in rows),
                        failing_tests=len(failed), pytest_exit=out.returncode,
                        seconds=round(time.perf_counter() - start))))
  if out.returncode:
    print(text[-4000:])


if __name__ == "__main__":
  main()
