"""A sweep's results: per-run figures (runs.csv), mean ± std over seeds per arm (results.csv,
results.md) and curves per arm with a seed band (reward_mean.png, eval_accuracy.png against
steps; eval_accuracy_wall.png against the runs' wall-clock seconds, where they record them).

Per run, from its metrics.jsonl and DONE.json:
    final_reward   mean of reward_mean over the last 10% of RL steps (at least one step)
    eval_accuracy  the last held-out greedy accuracy (the run's final evaluation)
    kl             mean of the update's kl over the last 10% of RL steps
    wall_s         wall time of the processes that ran it, a stopped and resumed run's summed
                   (for seeds run as one program: of all of them)
    eval_length    the last evaluation's mean completion length, where the task reports one
                   (addition_work); a column of the table only then
Over seeds: mean and sample standard deviation (ddof=1; 0 for a single seed).
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np

from grpo_jax.errors import first_line
from grpo_jax.sweep.runner import DONE_FILE, is_done
from grpo_jax.sweep.spec import Sweep, SweepError, run_dir

FIGURES = ("final_reward", "eval_accuracy", "kl", "wall_s", "eval_length")
LAST_FRACTION = 0.1


def read_metrics(directory: str) -> list[dict]:
  """metrics.jsonl's records; a line that is not JSON (a record a kill cut short) or that
  Python's json cannot read is left out, as the run's own reader leaves it out."""
  records = []
  with open(os.path.join(directory, "metrics.jsonl")) as f:
    for line in filter(str.strip, f):
      try:
        records.append(json.loads(line))
      except (ValueError, RecursionError):
        continue
  return records


def done_wall_s(directory: str) -> float:
  """The wall_s of a finished run's DONE.json; SweepError naming the file when it is damaged."""
  path = os.path.join(directory, DONE_FILE)
  try:
    with open(path) as f:
      return float(json.load(f)["wall_s"])
  except (ValueError, RecursionError, KeyError, TypeError) as e:
    raise SweepError(f"{path} is damaged ({first_line(e)}); delete it to "
                     f"run that seed again (its checkpoints resume it), or restore it.") from None


def run_figures(directory: str) -> dict:
  """The figures of one finished run (see the module docstring)."""
  records = read_metrics(directory)
  steps = [r for r in records if "reward_mean" in r]
  tail = steps[-max(1, int(round(len(steps) * LAST_FRACTION))):]
  evals = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
  lengths = [r["eval_length"] for r in records if "eval_length" in r]
  nan = float("nan")  # a run without RL steps (the DPO stage): no reward or KL figures
  return dict(final_reward=float(np.mean([r["reward_mean"] for r in tail])) if tail else nan,
              eval_accuracy=float(evals[-1]) if evals else nan,
              kl=float(np.mean([r["kl"] for r in tail])) if tail else nan,
              wall_s=done_wall_s(directory),
              steps=int(steps[-1]["step"]) if steps else 0,
              eval_length=float(lengths[-1]) if lengths else nan)


def mean_std(values) -> tuple[float, float]:
  values = np.asarray(values, np.float64)
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def collect_results(sweep: Sweep, sweep_dir: str) -> tuple[list[dict], list[dict]]:
  """(one row per finished run, one row per arm with mean/std over its finished seeds)."""
  runs, arms = [], []
  for arm in sweep.arms:
    rows = [{"arm": arm.name, **arm.values, "seed": seed,
             **run_figures(run_dir(sweep_dir, arm, seed))}
            for seed in sweep.seeds if is_done(sweep_dir, arm, seed)]
    runs.extend(rows)
    if not rows:
      continue
    summary = {"arm": arm.name, **arm.values, "seeds": len(rows)}
    for figure in FIGURES:
      summary[f"{figure}_mean"], summary[f"{figure}_std"] = mean_std([r[figure] for r in rows])
    arms.append(summary)
  return runs, arms


def _write_csv(path: str, rows: list[dict]) -> None:
  fields = list(dict.fromkeys(k for row in rows for k in row))
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)


def markdown_table(sweep: Sweep, arms: list[dict]) -> str:
  header = ["arm", "seeds", "final reward (last 10%)", "eval accuracy (end)", "KL (last 10%)",
            "wall s per process"]
  with_length = any(not np.isnan(a["eval_length_mean"]) for a in arms)
  if with_length:
    header.append("eval length (end, tokens)")
  lines = [f"Sweep `{sweep.name}`: base `{sweep.base_config}`, seeds {list(sweep.seeds)}, "
           f"seed axis `{sweep.seed_axis}`; mean ± std over seeds.", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  def cell(a, figure, digits):  # "-" where the arm has no such figure (no RL steps)
    mean, std = a[f"{figure}_mean"], a[f"{figure}_std"]
    return "-" if np.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"

  for a in arms:
    cells = [a["arm"], str(a["seeds"]), cell(a, "final_reward", 3), cell(a, "eval_accuracy", 3),
             cell(a, "kl", 4), cell(a, "wall_s", 0)]
    if with_length:
      cells.append(cell(a, "eval_length", 2))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
  if window <= 1 or len(values) < window:
    return values
  kernel = np.ones(window) / window
  padded = np.concatenate([np.full(window - 1, values[0]), values])
  return np.convolve(padded, kernel, mode="valid")


def points(records: list[dict], key: str, against: str = "step") -> list[tuple]:
  """(x, value) of every record with `key`: x its step, or with against="elapsed_s" the run's
  wall-clock seconds when that step ended (a record's own elapsed_s, else that of the step's
  record with one; 0 at step 0, before any step). [] when a step has no elapsed_s."""
  if against == "step":
    return [(r["step"], r[key]) for r in records if key in r]
  elapsed = {0: 0.0} | {r["step"]: r["elapsed_s"] for r in records if "elapsed_s" in r}
  out = [(elapsed.get(r["step"]), r[key]) for r in records if key in r]
  return out if all(x is not None for x, _ in out) else []


def plot_curves(sweep: Sweep, sweep_dir: str, key: str, path: str, smooth: int = 1,
                against: str = "step") -> bool:
  """Per arm: the mean over seeds of `key` against step (or wall-clock seconds, against=
  "elapsed_s": each x the mean over seeds), with a band of ± one std over seeds
  (`smooth`-step moving average of each seed first). False if no run has the key."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.2))
  drawn = False
  for arm in sweep.arms:
    found = [points(read_metrics(run_dir(sweep_dir, arm, seed)), key, against)
             for seed in sweep.seeds if is_done(sweep_dir, arm, seed)]
    curves = [np.asarray(xy, np.float64) for xy in found if xy]
    if not curves:
      continue
    length = min(len(c) for c in curves)
    steps = np.mean([c[:length, 0] for c in curves], axis=0)
    values = np.stack([_moving_average(c[:length, 1], smooth) for c in curves])
    mean, std = values.mean(0), values.std(0, ddof=1) if len(values) > 1 else 0 * values[0]
    (line,) = ax.plot(steps, mean, label=f"{arm.name} (n={len(curves)})")
    ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    drawn = True
  if drawn:
    ax.set_xlabel("step (an RL step, or an optimizer step of the DPO stage)" if against == "step"
                  else "wall-clock seconds of the run (mean over seeds)")
    ax.set_ylabel(key + (f" ({smooth}-step moving average)" if smooth > 1 else ""))
    ax.set_title(f"{sweep.name}: {key}, mean ± std over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
  plt.close(fig)
  return drawn


def write_report(sweep: Sweep, sweep_dir: str) -> list[str]:
  """Writes runs.csv, results.csv, results.md and the plots into sweep_dir; returns the paths."""
  runs, arms = collect_results(sweep, sweep_dir)
  if not runs:
    return []
  written = [os.path.join(sweep_dir, name) for name in ("runs.csv", "results.csv", "results.md")]
  _write_csv(written[0], runs)
  _write_csv(written[1], arms)
  with open(written[2], "w") as f:
    f.write(markdown_table(sweep, arms))
  for key, smooth, against, name in (("reward_mean", 10, "step", "reward_mean"),
                                     ("eval_accuracy", 1, "step", "eval_accuracy"),
                                     ("eval_length", 1, "step", "eval_length"),
                                     ("eval_accuracy", 1, "elapsed_s", "eval_accuracy_wall")):
    path = os.path.join(sweep_dir, f"{name}.png")
    if plot_curves(sweep, sweep_dir, key, path, smooth, against):
      written.append(path)
  return written
