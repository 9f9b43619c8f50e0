"""Optional Weights & Biases logging, offline (no network): every metrics record reaches the
W&B run, and a resumed run continues the same W&B run."""

import json

import pytest

from configs import grpo_tiny
from grpo_jax.train.stages.rl import train
from grpo_jax.train.run.metrics import dashboard_tag

wandb = pytest.importorskip("wandb")


def _config(steps: int):
  c = grpo_tiny.get_config()
  c.warmup.steps, c.train.steps, c.train.eval_every = 5, steps, 2
  c.train.eval_size = c.train.eval_batch_size = 20
  c.rollout.num_prompts, c.rollout.group_size = 2, 4
  c.train.wandb_project, c.train.wandb_mode = "grpo_jax_test", "offline"
  return c


def test_offline_wandb_gets_every_record_and_a_resume_continues_the_run(tmp_path, monkeypatch):
  logged = []
  original = wandb.sdk.wandb_run.Run.log

  def log(self, data, step=None, **kwargs):
    logged.append((self.id, step, dict(data)))
    return original(self, data, step=step, **kwargs)

  monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", log)
  workdir = tmp_path / "run"
  train(_config(2), str(workdir), log=lambda *a, **k: None)
  run_id = (workdir / "wandb_run_id").read_text()
  train(_config(3), str(workdir), log=lambda *a, **k: None)  # resumes from step 2
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1, 2, 3]
  assert {i for i, _, _ in logged} == {run_id}
  assert [s for _, s, _ in logged] == [0, 1, 2, 3]
  for (_, step, data), record in zip(logged, records):
    # Sample completions (samples.jsonl) ride along as text at the evaluation steps.
    texts = {k for k in data if k.startswith("samples/")}
    assert bool(texts) == ("eval_accuracy" in record), (step, texts)
    # The same values under grouped tags (eval/accuracy, reward/mean, train/loss, ...).
    assert {k: v for k, v in data.items() if k not in texts} == pytest.approx(
        {dashboard_tag(k): v for k, v in record.items() if k != "step"})
  runs = sorted(p.name for p in (workdir / "wandb").glob(f"offline-run-*-{run_id}"))
  assert len(runs) == 2 and all((workdir / "wandb" / r / f"run-{run_id}.wandb").stat().st_size
                                for r in runs)


def test_two_workdirs_in_one_process_get_two_wandb_runs(tmp_path):
  """Stacked seeds start one W&B run per seed folder in one process: each is its own run (the
  id of its wandb_run_id), not the one opened first."""
  from grpo_jax.train.run.wandb_logging import start_wandb  # noqa: PLC0415
  config = _config(1)
  for s in (0, 1):
    (tmp_path / f"seed_{s}").mkdir()
  runs = [start_wandb(config, str(tmp_path / f"seed_{s}")) for s in (0, 1)]
  try:
    assert [r.id for r in runs] == [(tmp_path / f"seed_{s}" / "wandb_run_id").read_text()
                                    for s in (0, 1)]
    assert runs[0].id != runs[1].id
  finally:
    for r in runs:
      r.finish()


def test_the_sft_stage_logs_every_record_to_its_wandb_run(tmp_path, monkeypatch):
  from configs import rlhf_tiny_sft  # noqa: PLC0415
  from grpo_jax.train.stages.supervised import train_sft  # noqa: PLC0415
  logged = []
  original = wandb.sdk.wandb_run.Run.log

  def log(self, data, step=None, **kwargs):
    logged.append((self.id, step, sorted(data)))
    return original(self, data, step=step, **kwargs)

  monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", log)
  c = rlhf_tiny_sft.get_config()
  c.warmup.steps, c.warmup.batch_size, c.train.num_samples = 1, 8, 0
  c.train.eval_size = c.train.eval_batch_size = 8
  c.train.wandb_project, c.train.wandb_mode = "grpo_jax_test", "offline"
  train_sft(c, str(tmp_path), log=lambda *a, **k: None)
  run_id = (tmp_path / "wandb_run_id").read_text()
  assert [(i, s) for i, s, _ in logged] == [(run_id, 0), (run_id, 1)]
  assert "eval/accuracy" in logged[0][2] and any("sft_loss" in k for k in logged[1][2])
