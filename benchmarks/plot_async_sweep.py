"""The async corrections sweep as one picture (docs/sweeps/async_corrections/panels.png): a
panel per rl.max_staleness, one colour per correction, held-out accuracy (mean over the seeds,
a band of one std) against steps (top row) and against the run's wall-clock seconds (bottom
row). The sweep's own plots draw all 20 arms in one panel.

    python benchmarks/plot_async_sweep.py --sweep_dir=/work/runs/async_sweep
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from grpo_jax.sweep.report import points, read_metrics

STALENESS = (0, 1, 2, 4)
CORRECTIONS = ("none", "tis", "mis", "cispo", "decoupled")
SEEDS = (0, 1, 2)


def mean_curve(sweep_dir: str, arm: str, against: str):
  """(x, mean, std) over the seeds of held-out accuracy; x the steps or the mean seconds."""
  curves = [np.asarray(points(read_metrics(os.path.join(sweep_dir, arm, f"seed_{s}")),
                              "eval_accuracy", against), np.float64) for s in SEEDS]
  stacked = np.stack(curves)
  return stacked[..., 0].mean(0), stacked[..., 1].mean(0), stacked[..., 1].std(0, ddof=1)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sweep_dir", required=True, help="the sweep's --workdir")
  parser.add_argument("--out", default="docs/sweeps/async_corrections/panels.png")
  args = parser.parse_args()
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  fig, axes = plt.subplots(2, len(STALENESS), figsize=(14, 6.4), sharey=True)
  for col, k in enumerate(STALENESS):
    for row, against in enumerate(("step", "elapsed_s")):
      ax = axes[row, col]
      for i, name in enumerate(CORRECTIONS):
        x, mean, std = mean_curve(args.sweep_dir, f"max_staleness={k},recipe={name}", against)
        ax.plot(x, mean, color=f"C{i}", label=name)
        ax.fill_between(x, mean - std, mean + std, color=f"C{i}", alpha=0.12)
      ax.set_title(f"max_staleness={k}" if row == 0 else "")
      ax.set_xlabel("RL step" if row == 0 else "wall-clock seconds of the RL steps")
      ax.grid(alpha=0.3)
    axes[0, col].set_ylim(0.0, 1.02)
  for row in range(2):
    axes[row, 0].set_ylabel("held-out accuracy")
  axes[0, 0].legend(loc="lower right", fontsize=8)
  fig.suptitle("tiny GRPO recipe: off-policy corrections by staleness, 3 seeds (mean ± std)")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  fig.savefig(args.out, dpi=110)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
