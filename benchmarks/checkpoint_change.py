"""How far the policy's weights moved between two checkpoints of one run: per weight array,
||W_b - W_a|| / ||W_a||, and the optimizer's count at each (issue 76).

    python benchmarks/checkpoint_change.py WORKDIR/checkpoints/20 WORKDIR/checkpoints/40

Prints one JSON line per array (key path, relative change) and one summary line with the
largest change, whether every array is bit-identical, and each checkpoint's `no_signal_updates`.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import orbax.checkpoint as ocp


def restore(path: str) -> dict:
  path = os.path.abspath(path)
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(os.path.join(path, "default"))


def main():
  a, b = (restore(p) for p in sys.argv[1:3])
  ta, tb = a, b  # (the learner's fields, the source's beside them)
  flat_a = dict(_flatten(ta["params"]))
  flat_b = dict(_flatten(tb["params"]))
  worst, identical = 0.0, True
  for key, wa in flat_a.items():
    wa, wb = np.asarray(wa), np.asarray(flat_b[key])
    change = float(np.linalg.norm(wb - wa) / max(np.linalg.norm(wa), 1e-30))
    identical &= bool(np.array_equal(wa, wb))
    worst = max(worst, change)
    print(json.dumps(dict(array=key, relative_change=change)))
  print(json.dumps(dict(steps=[int(ta["step"]), int(tb["step"])], largest_relative_change=worst,
                        bit_identical=identical,
                        no_signal_updates=[int(ta.get("no_signal_updates", -1)),
                                           int(tb.get("no_signal_updates", -1))])))


def _flatten(tree, prefix=""):
  if isinstance(tree, dict):
    for k, v in tree.items():
      yield from _flatten(v, f"{prefix}/{k}" if prefix else str(k))
  else:
    yield prefix, tree


if __name__ == "__main__":
  main()
