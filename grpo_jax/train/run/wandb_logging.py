"""Optional Weights & Biases logging (train.wandb_project), beside metrics.jsonl and
TensorBoard: every record of a workdir goes to one W&B run, whose id is kept in
workdir/wandb_run_id so that a resumed run continues it; stacked seeds, one process, hold one
run per seed folder open at once (reinit="create_new"). train.wandb_mode='offline' writes the
run under workdir/wandb/ without network (`wandb sync` uploads it later)."""

from __future__ import annotations

import os
import uuid


def start_wandb(config, workdir: str):
  """The W&B run of `workdir` (a new one, or the one its wandb_run_id names), or None when
  train.wandb_project is empty."""
  train_cfg = config.train
  project = train_cfg.wandb_project
  if not project:
    return None
  import wandb  # noqa: PLC0415
  from grpo_jax.train.run import files  # noqa: PLC0415
  id_file = files.path(workdir, "wandb_run_id")
  run_id = (files.read_text(id_file) or "").strip()
  if not run_id:
    run_id = uuid.uuid4().hex[:12]
    files.write_atomic(id_file, run_id)
  return wandb.init(project=project, dir=None if files.is_uri(workdir) else workdir, id=run_id,
                    resume="allow", reinit="create_new",  # (wandb >= 0.19.10)
                    mode=train_cfg.wandb_mode, config=config.to_dict(),
                    name=os.path.basename(os.path.abspath(workdir)),
                    settings=wandb.Settings(silent=True))
