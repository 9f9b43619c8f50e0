"""The supervised stages (grpo_jax/train/stages/supervised.py): SFT as a stage, Bradley-Terry reward-model
training with checkpoints and exact resume, and the three stages chained (SFT -> RM -> PPO with
the learned RM and a critic started from it), at a few steps each."""

import json
import os

import jax
import numpy as np
import pytest

from configs import rlhf_tiny_ppo, rlhf_tiny_rm, rlhf_tiny_sft
from grpo_jax.data.supervised import addition_preference_pairs, write_jsonl
from grpo_jax.rl.preference import bradley_terry_loss, pair_accuracy
from grpo_jax.train.run.setup import build_task
from tests.fixtures import with_fields


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_bradley_terry_loss_and_accuracy_against_numpy():
  rng = np.random.default_rng(0)
  c, r, m = rng.normal(size=64), rng.normal(size=64), rng.uniform(0, 1, size=64)
  expected = np.mean([np.log1p(np.exp(-(ci - ri - mi))) for ci, ri, mi in zip(c, r, m)])
  np.testing.assert_allclose(float(bradley_terry_loss(c, r, m)), expected, rtol=1e-5)
  np.testing.assert_allclose(float(bradley_terry_loss(c, r)),
                             np.mean(np.log1p(np.exp(-(c - r)))), rtol=1e-5)
  r[:3] = c[:3]  # ties count as wrong
  assert float(pair_accuracy(c, r)) == pytest.approx(np.mean(c > r))


def test_addition_pairs_prefer_the_right_sum():
  config = rlhf_tiny_sft.get_config()
  task = build_task(config)
  pairs = addition_preference_pairs(task, "test", 300, 0)
  for p in pairs:
    a, b = (int(x) for x in p["prompt"][:-1].split("+"))
    assert int(p["chosen"][::-1]) == a + b and p["rejected"] != p["chosen"]
  assert len({p["rejected"] for p in pairs}) > 100  # varied mistakes
  assert pairs == addition_preference_pairs(task, "test", 300, 0)  # a pure function


def _small(config, **fields):
  return with_fields(config, fields)


@pytest.fixture(scope="module")
def sft_root(tmp_path_factory):
  """A 60-step SFT stage on a jsonl file of {prompt, response} (the addition task's format)."""
  from grpo_jax.train.stages.supervised import train_sft
  root = tmp_path_factory.mktemp("rlhf")
  task = build_task(rlhf_tiny_sft.get_config())
  pairs = addition_preference_pairs(task, "train", 256, 0)
  write_jsonl(str(root / "sft.jsonl"), [{"prompt": p["prompt"], "response": p["chosen"]}
                                         for p in pairs])
  config = _small(rlhf_tiny_sft.get_config(), **{
      "warmup.steps": 60, "warmup.batch_size": 32, "warmup.data_path": str(root / "sft.jsonl"),
      "train.eval_size": 40, "train.eval_batch_size": 40})
  train_sft(config, str(root / "sft"), log=lambda *a: None)
  return root


def test_sft_stage_writes_losses_accuracy_and_an_export(sft_root):
  records = _records(sft_root / "sft")
  assert [r["step"] for r in records] == list(range(61))
  losses = [r["sft_loss"] for r in records[1:]]
  assert np.mean(losses[-10:]) < np.mean(losses[:10])
  assert "eval_accuracy" in records[0] and "eval_accuracy" in records[-1]
  assert records[-1]["eval_accuracy"] > records[0]["eval_accuracy"]
  assert (sft_root / "sft" / "hf_export" / "model.safetensors").is_file()


def test_sft_stage_resumes_exactly(sft_root, tmp_path):
  """SFT on the loop skeleton: a run stopped after its step-20 checkpoint and run again with
  the same command ends where the straight run ends (params and every record)."""
  import shutil
  from grpo_jax.train.stages.supervised import train_sft
  config = _small(rlhf_tiny_sft.get_config(), **{
      "warmup.steps": 40, "warmup.batch_size": 32,
      "warmup.data_path": str(sft_root / "sft.jsonl"), "train.eval_size": 20,
      "train.eval_batch_size": 20, "train.checkpoint_every": 10, "train.keep_checkpoints": 5})
  quiet = lambda *a: None  # noqa: E731
  straight = train_sft(config, str(tmp_path / "straight"), log=quiet)
  shutil.copytree(tmp_path / "straight", tmp_path / "split")
  for step in ("30", "40"):  # as if stopped after the checkpoint of step 20
    shutil.rmtree(tmp_path / "split" / "checkpoints" / step)
  shutil.rmtree(tmp_path / "split" / "hf_export")
  lines = []
  resumed = train_sft(config, str(tmp_path / "split"), log=lines.append)
  assert any("resumed from checkpoint" in line and line.endswith("/20") for line in lines)
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)
  a, b = _records(tmp_path / "straight"), _records(tmp_path / "split")
  assert [r["step"] for r in b] == list(range(41)) and a == b
  # what the stage says: its workdir first, a closing line last, a picture of its curves; run
  # again once finished, it says so, exports nothing again and changes no record
  split = tmp_path / "split"
  assert lines[0].startswith(f"workdir {split}: ") and (split / "curves.png").is_file()
  assert lines[-1].startswith("done: step 40/40 in ") and "held-out eval_accuracy" in lines[-1]
  assert lines[-1].endswith(f"files in {split}: metrics.jsonl, curves.png, checkpoints/40, "
                            f"hf_export/")
  lines.clear()
  export = (split / "hf_export" / "model.safetensors").stat().st_mtime_ns
  train_sft(config, str(split), log=lines.append)
  assert any(line.startswith("sft: this run is finished (step 40 of 40)") for line in lines)
  assert lines[-1].startswith("done: step 40/40; held-out eval_accuracy")
  assert (split / "hf_export" / "model.safetensors").stat().st_mtime_ns == export
  assert _records(split) == b
  # run again with another export dtype: the export is written again in it (it was kept as it
  # was, its config.json saying float32 under a run record saying bfloat16)
  config.train.export_dtype = "bfloat16"
  train_sft(config, str(split), log=lines.append)
  exported = json.loads((split / "hf_export" / "config.json").read_text())
  assert exported.get("torch_dtype", exported.get("dtype")) == "bfloat16"
  # an export that cannot be written is one sentence, as the RL stage's (it was a traceback)
  shutil.rmtree(split / "hf_export")
  (split / "hf_export").write_text("a file where the folder goes")
  from grpo_jax.errors import RunStopped  # noqa: PLC0415
  with pytest.raises(RunStopped, match=r"^writing the export .*hf_export failed \(File"):
    train_sft(config, str(split), log=lines.append)


def _rm_config(root, steps):
  return _small(rlhf_tiny_rm.get_config(str(root)), **{
      "rm.steps": steps, "rm.batch_size": 16, "rm.train_pairs": 400, "rm.test_pairs": 48,
      "rm.eval_every": 4, "train.checkpoint_every": 4, "train.eval_size": 40,
      "train.eval_batch_size": 40})


def test_reward_model_training_resumes_exactly(sft_root, tmp_path):
  from grpo_jax.train.stages.supervised import train_reward_model
  quiet = lambda *a: None  # noqa: E731
  straight = train_reward_model(_rm_config(sft_root, 8), str(tmp_path / "straight"), log=quiet)
  train_reward_model(_rm_config(sft_root, 4), str(tmp_path / "split"), log=quiet)
  resumed = train_reward_model(_rm_config(sft_root, 8), str(tmp_path / "split"), log=quiet)
  jax.tree.map(np.testing.assert_array_equal, straight.params, resumed.params)
  a, b = _records(tmp_path / "straight"), _records(tmp_path / "split")
  assert [r["step"] for r in b] == list(range(9))
  assert "pair_accuracy" in a[0] and "pair_accuracy" in a[-1]
  for x, y in zip(a, b):
    assert x == y
  assert (tmp_path / "straight" / "hf_export" / "config.json").is_file()


def test_the_three_stages_chain(sft_root, tmp_path):
  """PPO from the SFT export, the learned RM its only reward and the critic's start."""
  from grpo_jax.train.stages.rl import train
  from grpo_jax.train.stages.supervised import train_reward_model
  train_reward_model(_rm_config(sft_root, 4), str(sft_root / "rm"), log=lambda *a: None)
  config = _small(rlhf_tiny_ppo.get_config(str(sft_root)), **{
      "train.steps": 2, "train.eval_every": 2, "train.eval_size": 40,
      "train.eval_batch_size": 40, "rollout.num_prompts": 16, "train.checkpoint_every": 0})
  train(config, str(tmp_path / "ppo"), log=lambda *a: None)
  records = _records(tmp_path / "ppo")
  assert "eval_accuracy" in records[0] and "eval_accuracy" in records[-1]
  assert "reward/rm_mean" in records[1] and "value_loss" in records[1]
  assert (tmp_path / "ppo" / "hf_export" / "model.safetensors").is_file()
