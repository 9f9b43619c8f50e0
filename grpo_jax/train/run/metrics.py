"""Where metrics go: workdir/metrics.jsonl (one JSON object per record), TensorBoard event
files (tensorboardX, no TensorFlow needed), a W&B run when train.wandb_project is set
(grpo_jax/train/run/wandb_logging.py), and a progress line on stdout."""

from __future__ import annotations

import json
import math
import sys
from typing import Mapping

import numpy as np

from grpo_jax.errors import first_line
from grpo_jax.train.run import files

# Wall-clock fields: the only metrics that differ between two runs of the same config.
TIMING_KEYS = ("tokens_per_s", "step_time_s", "elapsed_s", "rollout_tokens_per_s",
               "time_rollout_s", "time_reward_s", "time_update_s", "time_waiting_for_batch_s",
               "weight_sync_s")


# A step's rollout statistics (rollout_metrics, step_record): TensorBoard's "rollout/" group.
ROLLOUT_KEYS = ("response_len", "truncated_frac", "frac_groups_all_same", "sampling_rounds",
                "groups_without_spread")


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported with torch held off: its writer module imports
  torch, when installed, only to accept torch tensors (1.7 s of every run's start on a 2-core
  CPU); we write Python floats, which never reach torch."""
  hold = "torch" not in sys.modules
  if hold:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX handles
  try:
    from tensorboardX import SummaryWriter  # noqa: PLC0415
  finally:
    if hold and sys.modules.get("torch", False) is None:
      del sys.modules["torch"]
  return SummaryWriter


def dashboard_tag(key: str) -> str:
  """A metrics.jsonl key's TensorBoard / W&B tag, grouped: eval/ (eval_accuracy ->
  eval/accuracy), reward/ (reward_mean -> reward/mean; reward/<source>_mean as it is), time/
  (the wall-clock fields), rollout/ (ROLLOUT_KEYS) and train/ (the rest: loss, kl, ...)."""
  if "/" in key:
    return key
  for prefix, group in (("eval_", "eval/"), ("reward_", "reward/")):
    if key.startswith(prefix):
      return group + key[len(prefix):]
  if key in TIMING_KEYS:
    return "time/" + key
  return ("rollout/" if key in ROLLOUT_KEYS else "train/") + key


def to_python(metrics: Mapping) -> dict:
  items = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}
  return {k: float(v) if isinstance(v, float) or hasattr(v, "dtype") else v
          for k, v in items.items()}


def rollout_metrics(rewards, completion_mask, truncated, group_size: int, xp=np) -> dict:
  """A step's rollout statistics, on the host (xp=numpy) or inside jit (xp=jax.numpy)."""
  groups = xp.asarray(rewards).reshape(-1, group_size)
  mask = xp.asarray(completion_mask)
  return dict(reward_mean=groups.mean(), reward_std=groups.std(),
              frac_groups_all_same=xp.mean(groups.min(1) == groups.max(1)),
              response_len=mask.sum(1).mean(), truncated_frac=xp.asarray(truncated).mean())


def step_record(step_metrics: Mapping, rollout_stats: Mapping, on_reward_error: str,
                sampling_rounds: int = 1, groups_without_spread: int = 0,
                reward_errors: int = 0) -> dict:
  """One step's metrics record (before evaluation and timing) from host values: the RL step's
  metrics, then the rollout's (`rollout_metrics`), then the KL coefficient (and the reward
  errors counted, under train.on_reward_error="zero")."""
  record = {k: v for k, v in step_metrics.items() if k != "kl_coef"}
  record.update({k: float(v) for k, v in rollout_stats.items()})
  record.update(sampling_rounds=sampling_rounds, groups_without_spread=groups_without_spread,
                kl_coef=float(step_metrics["kl_coef"]))
  if on_reward_error == "zero":
    record["reward_errors"] = reward_errors
  return record


def step_tokens(rollout) -> int:
  """Prompt and completion tokens of a step's rollout (for tokens/s)."""
  return int(np.asarray(rollout.prompt_mask).sum() + np.asarray(rollout.completion_mask).sum())


def keep_records_until(path: str, step: int) -> int:
  """Rewrites metrics.jsonl keeping every readable record of a step <= `step` (the
  resumed-from step; none with step=-1): a run killed after its last checkpoint may have written
  records past it, which the resumed run writes again. Unreadable lines (blank, or a record cut
  short by a kill) are skipped, never the valid records after them. The new file is written
  beside the old one and renamed over it, so a kill during the rewrite loses nothing. Returns
  how many lines were dropped."""
  def keep(line: str) -> bool:
    try:
      return json.loads(line)["step"] <= step
    except (ValueError, KeyError, TypeError, RecursionError):  # (RecursionError: too deep)
      return False
  lines = (files.read_text(path, errors="replace") or "").splitlines()
  kept = [line for line in lines if keep(line)]
  files.write_atomic(path, "".join(line + "\n" for line in kept))
  return len(lines) - len(kept)


class MetricsWriter:
  def __init__(self, workdir: str, total_steps: int, stream=sys.stdout, enabled: bool = True,
               wandb_run=None):
    self.path = files.path(workdir, "metrics.jsonl")
    self.total_steps = total_steps
    self.stream = stream
    self.enabled = enabled  # only process 0 of a multi-host run writes
    self._wandb = wandb_run
    self._wandb_text = {}  # write_text's texts, logged with the step's next record
    self._tb = None
    if not enabled:
      return
    try:
      SummaryWriter = _summary_writer_class()
    except ImportError:  # optional: metrics.jsonl is the record of truth
      return
    try:
      self._tb = SummaryWriter(logdir=str(workdir), flush_secs=10)
    except Exception as e:  # noqa: BLE001  gs:// needs google-cloud-storage, s3:// boto3
      print(f"warning: no TensorBoard events in {workdir} ({first_line(e)}); metrics.jsonl has "
            f"every record.", file=stream)

  def write(self, step: int, metrics: Mapping, prefix: str = "") -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **to_python(metrics)}
    if not prefix:
      files.append(self.path, json.dumps(record) + "\n")
    scalars = {dashboard_tag(f"{prefix}{k}"): v for k, v in record.items()
               if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, int(step))
    if self._wandb is not None:
      self._wandb.log({**scalars, **self._wandb_text}, step=int(step))
      self._wandb_text = {}

  def write_text(self, step: int, tag: str, text: str) -> None:
    """Text (e.g. sample completions) to TensorBoard now and to W&B with the step's next
    record (one W&B log call per step)."""
    if not self.enabled:
      return
    if self._tb is not None:
      self._tb.add_text(tag, text, int(step))
    if self._wandb is not None:
      self._wandb_text[tag] = text

  def progress(self, step: int, m: Mapping, eta: str) -> None:
    """One console line of a step; `eta` as runner.Clock.eta writes it."""
    if not self.enabled:
      return
    parts = [f"step {step:>4}/{self.total_steps}",
             f"reward {m['reward_mean']:.3f}", f"kl {m['kl']:.4f}",
             f"loss {m['loss']:+.4f}", f"clip {m['clip_frac']:.3f}",
             f"len {m['response_len']:.2f}", f"tok/s {m['tokens_per_s']:,.0f}", eta]
    if "time_update_s" in m:  # where the step went
      parts.append(f"rollout {m['time_rollout_s']:.1f}s reward {m['time_reward_s']:.1f}s "
                   f"update {m['time_update_s']:.1f}s")
    if m.get("reward_errors"):
      parts.append(f"reward errors {m['reward_errors']}")
    if "eval_accuracy" in m:
      parts.append(f"eval_acc {m['eval_accuracy']:.3f}")
    print(" | ".join(parts), file=self.stream, flush=True)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()
