"""Compares two metrics.jsonl files record by record, every field except the wall-clock ones
(grpo_jax.train.run.metrics.TIMING_KEYS): prints "identical" or the first differing record and field.

    python benchmarks/compare_metrics.py A/metrics.jsonl B/metrics.jsonl
Exit status 0 when identical, 1 otherwise.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from grpo_jax.train.run.metrics import TIMING_KEYS  # noqa: E402


def records(path):
  with open(path) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in f]


def main(a_path, b_path) -> int:
  a, b = records(a_path), records(b_path)
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      for key in sorted(set(x) | set(y)):
        if x.get(key) != y.get(key):
          print(f"first difference: record {i} (step {x.get('step')}), field {key!r}: "
                f"{x.get(key)!r} vs {y.get(key)!r}")
          return 1
  if len(a) != len(b):
    print(f"different lengths: {len(a)} vs {len(b)} records")
    return 1
  print(f"identical: {len(a)} records, every field except {', '.join(TIMING_KEYS)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(*sys.argv[1:3]))
