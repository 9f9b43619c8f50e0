"""What a run says about itself: where its files are (its first lines), a picture of its
learning curves (`curves.png`, redrawn at each evaluation) and one closing line (held-out
start -> end, steps, wall time, the files). All of it is read back from metrics.jsonl, the
run's record, so a resumed run reports its whole history."""

from __future__ import annotations

import contextlib
import json
import sys

from grpo_jax.train.run import files
from grpo_jax.train.run.no_signal import no_signal_note

CURVES_FILE = "curves.png"
# (metric, label) drawn against step, each where the run records it
CURVES = (("reward_mean", "training reward (mean over the batch)"),
          ("eval_accuracy", "held-out accuracy (greedy)"),
          ("eval_pair_accuracy", "held-out pair accuracy (the policy's implicit reward)"),
          ("pair_accuracy", "held-out pair accuracy (the reward model)"))


def read_records(workdir: str) -> list[dict]:
  """metrics.jsonl's records ([] before the first; a line that is not JSON, or that Python's
  json cannot read, is left out)."""
  text = files.read_text(files.path(workdir, "metrics.jsonl"), errors="replace") or ""
  records = []
  for line in text.splitlines():
    try:
      records.append(json.loads(line))
    except (ValueError, RecursionError):  # not JSON, a 5,000-digit integer, nested too deep
      continue
  return records


def elapsed_before(workdir: str) -> float:
  """The wall-clock seconds the run's earlier processes recorded (the last record's elapsed_s;
  0 for a fresh run), from which a resumed process counts on."""
  return max((r.get("elapsed_s", 0.0) for r in read_records(workdir)), default=0.0)


def where_line(workdir: str, tensorboard: bool = True, per_seed=()) -> str:
  """The run's first line about its files; per_seed: the seeds' own folders, when stacked seeds
  write one each."""
  files = f"metrics.jsonl, {CURVES_FILE} and checkpoints/"
  line = (f"workdir {workdir}: {files} go there (the same command resumes it)" if not per_seed
          else f"workdir {workdir}: each seed's {files} go to its folder ({', '.join(per_seed)};"
               f" the same command resumes them)")
  return line + (f"; watch it with tensorboard --logdir {workdir}" if tensorboard else "")


def write_curves(workdir: str, records: list[dict] | None = None) -> bool:
  """Draws CURVES against step into workdir/curves.png; False when there is nothing to draw
  yet, or (one warning line) when drawing fails: a picture never stops a run. Matplotlib's
  Agg backend, no display needed; written to a temporary name, then renamed."""
  try:
    return _draw(workdir, records)
  except Exception as e:  # noqa: BLE001  (a full disk, a broken matplotlib install)
    print(f"warning: {CURVES_FILE} was not drawn ({type(e).__name__}: {e})", file=sys.stderr)
    return False


def _draw(workdir: str, records: list[dict] | None) -> bool:
  records = read_records(workdir) if records is None else records
  series = [(key, label, [(r["step"], r[key]) for r in records if key in r])
            for key, label in CURVES]
  series = [s for s in series if s[2]]
  if not series:
    return False
  import matplotlib  # noqa: PLC0415  (slow to import; only when a picture is drawn)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  partial = files.path(workdir, CURVES_FILE + ".partial")
  try:  # a failed write (a full disk) leaves neither the figure open nor the partial file
    for _, label, points in series:
      steps, values = zip(*points)
      ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3,
              label=label)
    ax.set_xlabel("step")
    ax.set_ylim(bottom=min(0.0, *(v for _, _, p in series for _, v in p)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(workdir, fontsize=8)
    fig.tight_layout()
    with partial.open("wb") as f:
      fig.savefig(f, format="png", dpi=100)
    partial.replace(files.path(workdir, CURVES_FILE))
  except BaseException:
    with contextlib.suppress(OSError):
      partial.unlink(missing_ok=True)
    raise
  finally:
    plt.close(fig)
  return True


def longer_run(name: str, length: tuple, config) -> str:
  """How a longer run of a finished stage starts: a larger `length` field resumes it under
  optim.schedule 'constant'; else (no such field, as SFT's warm-up cosine, or a decaying
  schedule: the resume guard refuses a new length) only a fresh workdir does."""
  if length and config.optim.get("schedule", "constant") == "constant":
    return f"a larger {' / '.join(length)} continues it, a fresh --workdir starts a new one"
  return (f"a longer {name} run needs a fresh --workdir (its learning rate's schedule spans its "
          f"length)")


def closing_line(workdir: str, steps: int, wall_s: float | None, checkpoint: str | None,
                 exported: bool, records: list[dict] | None = None,
                 metric: str = "eval_accuracy") -> str:
  """`done: step 60/60 in 6m20s; held-out eval_accuracy 0.000 (step 0) -> 0.953 (step 60);
  files in DIR: ...` (the figures from metrics.jsonl, the run's whole history)."""
  records = read_records(workdir) if records is None else records
  evals = [(r["step"], r[metric]) for r in records if metric in r]
  last = max((r["step"] for r in records), default=0)
  line = f"done: step {last}/{steps}"
  if wall_s is not None:  # this process's time (None: a finished run, run again)
    seconds = int(round(wall_s))
    line += f" in {seconds // 60}m{seconds % 60:02d}s"
  if evals:
    (s0, v0), (s1, v1) = evals[0], evals[-1]
    line += f"; held-out {metric} {v0:.3f} (step {s0}) -> {v1:.3f} (step {s1})"
  line += no_signal_note(records)
  parts = [name for name in ("metrics.jsonl", CURVES_FILE, "samples.jsonl")
           if files.exists(files.path(workdir, name))]
  if checkpoint:
    parts.append(checkpoint)
  if exported:
    parts.append("hf_export/")
  return line + f"; files in {workdir}: {', '.join(parts)}"
