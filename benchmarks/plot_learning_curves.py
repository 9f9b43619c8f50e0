"""The README's picture (docs/img/learning_curves.png): the tiny GRPO run's training reward and
held-out accuracy against step, beside SmolLM2-135M-Instruct's held-out accuracy.

    python benchmarks/plot_learning_curves.py --tiny=/tmp/grpo_tiny \
        [--smollm2 /tmp/sm/grpo_smollm2/seed_0 /tmp/sm/grpo_smollm2/seed_1 ...]

Each panel reads a workdir's metrics.jsonl (the right one a line per SmolLM2 workdir, one per
seed). Without --smollm2 the right panel shows the three seeds measured on 2026-12-07
(SMOLLM2_MEASURED: 2-core AMD EPYC, docs/real_models.md), whose workdirs are not kept.
"""

from __future__ import annotations

import argparse
import json
import os

# Held-out accuracy at steps 0, 20, 40 per seed (docs/real_models.md, 2026-12-07).
SMOLLM2_MEASURED = {0: [(0, 0.055), (20, 0.250), (40, 0.470)],
                    1: [(0, 0.055), (20, 0.240), (40, 0.335)],
                    2: [(0, 0.055), (20, 0.435), (40, 0.645)]}


def _series(workdir: str, key: str) -> list[tuple[int, float]]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [(r["step"], r[key]) for r in records if key in r]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tiny", required=True, help="the tiny run's workdir")
  parser.add_argument("--tiny_label", default="tiny GRPO, seed 0")
  parser.add_argument("--smollm2", nargs="*", default=[],
                      help="SmolLM2 runs' workdirs, seeds 0, 1, ... (optional)")
  parser.add_argument("--smollm2_label",
                      default="SmolLM2-135M-Instruct GRPO, 2-core AMD EPYC, 2026-12-07")
  parser.add_argument("--out", default="docs/img/learning_curves.png")
  args = parser.parse_args()
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
  for key, label in (("reward_mean", "training reward"), ("eval_accuracy", "held-out accuracy")):
    steps, values = zip(*_series(args.tiny, key))
    left.plot(steps, values, label=label, marker="o" if key == "eval_accuracy" else None,
              markersize=4)
  left.set_title(f"{args.tiny_label}: 2-digit addition, 0.4M params", fontsize=9)
  runs = ({seed: _series(workdir, "eval_accuracy") for seed, workdir in enumerate(args.smollm2)}
          if args.smollm2 else SMOLLM2_MEASURED)
  for seed, points in runs.items():
    steps, values = zip(*points)
    right.plot(steps, values, marker="o", label=f"held-out accuracy, seed {seed}")
  right.set_title(args.smollm2_label, fontsize=9)
  for ax in (left, right):
    ax.set_xlabel("RL step")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
  fig.tight_layout()
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  fig.savefig(args.out, dpi=100)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
