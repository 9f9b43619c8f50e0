"""The preference-optimisation stage (grpo_jax/train/stages/preference.py, python -m
grpo_jax.train_dpo) at a few steps: exact resume, the start's loss, the cached reference against
the on-the-fly one, KTO's and the reference-free losses' paths, bad configs."""

import json
import math
import os

import jax
import numpy as np
import pytest

from configs import dpo_tiny
from grpo_jax.errors import ConfigError


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _config(steps, **fields):
  config = dpo_tiny.get_config()
  values = {"warmup.steps": 30, "warmup.batch_size": 32, "dpo.steps": steps,
            "dpo.batch_size": 16, "dpo.train_pairs": 160, "dpo.test_pairs": 32,
            "dpo.eval_every": 3, "train.checkpoint_every": 3, "train.eval_size": 24,
            "train.eval_batch_size": 24, "dpo.export": False, **fields}
  for key, value in values.items():
    section, leaf = key.split(".")
    config[section][leaf] = value
  return config


def _train(config, workdir, log=lambda *a: None):
  from grpo_jax.train.stages.preference import train_dpo  # noqa: PLC0415
  return train_dpo(config, str(workdir), log=log)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("dpo") / "straight"
  return workdir, _train(_config(6), workdir)


def test_dpo_stage_starts_at_log2_and_records_the_start_and_the_end(straight):
  """At step 1 the policy is the reference: Δ = 0 for every pair, the loss log 2 and every
  implicit reward 0; the held-out accuracy of the SFT start at step 0 and at the end."""
  records = _records(straight[0])
  assert [r["step"] for r in records] == list(range(7))
  assert records[1]["loss"] == pytest.approx(math.log(2), abs=1e-6)
  assert records[1]["reward_margin"] == pytest.approx(0.0, abs=1e-6)
  for r in (records[0], records[3], records[6]):
    assert {"eval_accuracy", "eval_pair_accuracy", "eval_reward_margin"} <= set(r)
  assert records[6]["eval_reward_margin"] > 0.0 and records[6]["loss"] < math.log(2)


def test_dpo_stage_resumes_exactly(straight, tmp_path):
  _train(_config(3), tmp_path)
  lines = []
  resumed = _train(_config(6), tmp_path, log=lines.append)
  assert any("resumed from checkpoint" in line for line in lines)
  jax.tree.map(np.testing.assert_array_equal, straight[1].params, resumed.params)
  assert _records(straight[0]) == _records(tmp_path)


def test_on_the_fly_reference_equals_the_cached_one(straight, tmp_path):
  _train(_config(3, **{"dpo.reference": "on_the_fly"}), tmp_path)
  a, b = _records(straight[0])[1:4], _records(tmp_path)[1:4]
  for x, y in zip(a, b):
    for key in ("loss", "reward_margin", "pair_accuracy"):
      assert x[key] == pytest.approx(y[key], abs=1e-5), key


@pytest.mark.parametrize("loss", ["kto", "orpo"])
def test_kto_and_a_reference_free_loss_run(loss, tmp_path):
  state = _train(_config(2, **{"dpo.loss": loss, "dpo.eval_every": 2}), tmp_path)
  records = _records(tmp_path)
  assert all(math.isfinite(r["loss"]) for r in records[1:])
  if loss == "kto":  # the policy is the reference at step 1: z0 = 0, every 1 - σ(0) = 1/2
    assert records[1]["kl"] == 0.0 and records[1]["loss"] == pytest.approx(0.5, abs=1e-6)
  else:  # β × the per-token log-probs, no reference in the rewards, and no copy kept
    assert records[1]["rewards_chosen"] < 0.0
    assert state.ref_params is None


def _unpaired_files(tmp_path, config):
  """The task's pairs as KTO's unpaired records: every chosen completion desirable, one
  rejected completion in three undesirable (an imbalanced set, as real feedback is)."""
  from grpo_jax.data.supervised import write_jsonl  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  from grpo_jax.train.stages.supervised import preference_pairs  # noqa: PLC0415
  task = build_task(config, lambda *a: None)
  paths = {}
  for split in ("train", "test"):
    records = []
    for i, r in enumerate(preference_pairs(config, "dpo", task, split)):
      records.append({"prompt": r["prompt"], "completion": r["chosen"], "label": True})
      if i % 3 == 0:
        records.append({"prompt": r["prompt"], "completion": r["rejected"], "label": False})
    paths[split] = str(tmp_path / f"{split}.jsonl")
    write_jsonl(paths[split], records)
  return paths


def test_kto_trains_on_unpaired_labelled_completions(tmp_path):
  """{prompt, completion, label} files: KTO's step 1 is 1/2 (z0 = 0 and every completion's
  term 1 - σ(0)), the labelled metrics are recorded, and after 6 steps the desirable
  completions' implicit reward is above the undesirable ones'; another loss on such a file
  is one sentence, as is a record without a boolean label."""
  paths = _unpaired_files(tmp_path, _config(4))
  fields = {"dpo.loss": "kto", "dpo.train_path": paths["train"], "dpo.test_path": paths["test"],
            "dpo.eval_every": 6, "optim.learning_rate": 1e-3, "optim.warmup_steps": 1}
  lines = []
  _train(_config(6, **fields), tmp_path / "run", log=lines.append)
  assert any("training labelled completions" in line for line in lines)
  records = _records(tmp_path / "run")
  assert records[1]["loss"] == pytest.approx(0.5, abs=1e-6) and records[1]["kl"] == 0.0
  assert {"eval_label_accuracy", "eval_reward_margin"} <= set(records[6])
  assert records[6]["reward_margin"] > 0.0 and records[6]["eval_reward_margin"] > 0.0
  with pytest.raises(ConfigError, match="only dpo.loss='kto' trains on"):
    _train(_config(2, **{**fields, "dpo.loss": "dpo"}), tmp_path / "dpo")
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "1+1=", "completion": "2", "label": "yes"}\n')
  from grpo_jax.errors import InputError  # noqa: PLC0415
  with pytest.raises(InputError, match="line 1 has label='yes'"):
    _train(_config(2, **{**fields, "dpo.train_path": str(bad)}), tmp_path / "bad")


def test_dpo_with_lora_starts_at_the_base_and_resumes_exactly(tmp_path):
  """lora.rank = 4: the state trains the adapters only, the frozen base is the reference (no
  copy), step 1 is log 2 (B = 0: the policy is the base), and a run stopped after step 2 and
  run again (the base rebuilt from the warm-up) ends where the straight one ends."""
  fields = {"lora.rank": 4, "lora.alpha": 8.0, "optim.learning_rate": 1e-3, "dpo.eval_every": 2}
  straight = _train(_config(4, **fields), tmp_path / "straight")
  records = _records(tmp_path / "straight")
  assert records[1]["loss"] == pytest.approx(math.log(2), abs=1e-6)
  assert records[4]["loss"] < records[1]["loss"] and records[4]["eval_reward_margin"] > 0.0
  assert straight.ref_params is None and straight.base_params is not None
  trainable = sum(x.size for x in jax.tree.leaves(straight.params))
  assert trainable < sum(x.size for x in jax.tree.leaves(straight.base_params)) / 4
  _train(_config(2, **fields), tmp_path / "split")
  lines = []
  resumed = _train(_config(4, **fields), tmp_path / "split", log=lines.append)
  assert any("frozen base rebuilt" in line for line in lines)
  jax.tree.map(np.testing.assert_array_equal, straight.params, resumed.params)
  assert _records(tmp_path / "straight") == _records(tmp_path / "split")


@pytest.mark.parametrize("field, value, message", [
    ("dpo.loss", "dpoo", "dpo.loss"),
    ("dpo.reference", "cache", "dpo.reference='cache'"),
    ("dpo.label_smoothing", 0.5, "dpo.label_smoothing=0.5"),
    ("dpo.batch_size", 0, "dpo.batch_size=0"),
    # the file was read, checked and fingerprinted, then each round trained on its own pairs
    ("dpo.rounds", 2, "dpo.train_path='/nonexistent.jsonl' is not read when dpo.rounds=2")])
def test_bad_dpo_configs_fail_in_one_sentence_before_compute(field, value, message, tmp_path):
  extra = ({"dpo.loss": "cdpo"} if "smoothing" in field else
           {"dpo.train_path": "/nonexistent.jsonl"} if field == "dpo.rounds" else {})
  with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
    _train(_config(2, **{field: value, **extra}), tmp_path)


def test_iterative_rpo_rounds_resume_exactly(tmp_path):
  """Two rounds of 2 steps on the policy's own samples: stopped after step 3 (mid round 2) and
  run again, the run ends where the straight one ends; each round logs its own pairs."""
  fields = {"dpo.loss": "rpo", "dpo.rounds": 2, "dpo.steps": 2, "dpo.round_prompts": 128,
            "warmup.steps": 200,
            "dpo.eval_every": 2, "train.checkpoint_every": 1, "train.keep_checkpoints": 10}
  lines = []
  straight = _train(_config(2, **fields), tmp_path / "straight", log=lines.append)
  assert sum("round" in line and "pairs of the policy's own" in line for line in lines) == 2
  import shutil  # noqa: PLC0415
  shutil.copytree(tmp_path / "straight", tmp_path / "split")
  shutil.rmtree(tmp_path / "split" / "checkpoints" / "4")  # as if stopped after step 3
  resumed = _train(_config(2, **fields), tmp_path / "split")
  jax.tree.map(np.testing.assert_array_equal, straight.params, resumed.params)
  jax.tree.map(np.testing.assert_array_equal, straight.ref_params, resumed.ref_params)
  assert _records(tmp_path / "straight") == _records(tmp_path / "split")


def test_iterative_rpo_pairs_no_wrong_sample_whose_text_is_a_right_one():
  """self_pairs pairs by decoded text: a wrong sample of the right digits and an id the
  tokenizer decodes to nothing (the tiny model's vocab of 16 has one past the tokenizer's 15)
  read as the right answer, and became the rejected of a pair whose chosen was the same text:
  a pair with no preference. Such a sample is no wrong text now."""
  import types  # noqa: PLC0415

  from configs import iterative_rpo_tiny  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  from grpo_jax.train.stages.preference import self_pairs  # noqa: PLC0415
  config = iterative_rpo_tiny.get_config()
  config.dpo.round_prompts, config.rollout.group_size = 1, 3
  config.rollout.max_new_tokens = n = 6  # room for the extra token
  task = build_task(config, lambda *a: None)
  assert config.model.vocab_size > task.tokenizer.vocab_size
  prompts = task.train_batch(0, 1, int(config.seed) + 5)
  right = [int(t) for t, m in zip(prompts.target_tokens[0], prompts.target_mask[0]) if m]
  rows = [right, right[:-1] + [config.model.vocab_size - 1, task.eos_id], [task.eos_id]]
  tokens = np.zeros((3, n), np.int32)
  mask = np.zeros((3, n), bool)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], mask[i, :len(r)] = r, True
  def sample(*_):
    return types.SimpleNamespace(completion_tokens=tokens, completion_mask=mask)

  assert list(task.score(prompts, tokens, mask, 3)) == [1.0, 0.0, 0.0]
  pairs = self_pairs(config, task, sample, None, 0)
  assert pairs and all(p["chosen"] != p["rejected"] for p in pairs), pairs
  assert [p["rejected"] for p in pairs] == [""]  # the empty answer, the one wrong text left


def test_kto_metrics_leave_out_the_means_over_a_kind_the_batch_has_none_of():
  """A batch of desirable completions only reported rewards_rejected = logps_rejected = 0 and a
  margin against that 0; now those keys are left out (the counts say why), under jit as the
  step computes them, with and without the held-out prefix."""
  import jax.numpy as jnp  # noqa: PLC0415

  from grpo_jax.rl.dpo import PairLogps  # noqa: PLC0415
  from grpo_jax.train.stages.preference_step import reported, reward_metrics  # noqa: PLC0415
  logps = jnp.array([-1.0, -2.0, -4.0])
  ref = logps - jnp.array([0.5, 1.0, 2.0])  # implicit rewards 0.05, 0.1, 0.2 at beta 0.1
  metrics = jax.jit(reward_metrics, static_argnums=(1, 2, 3))

  def record(labels, prefix=""):
    p = PairLogps(logps, None, jnp.ones(3), None, ref, None, jnp.float32(0.0),
                  jnp.array(labels))
    return reported(metrics(p, 0.1, False, prefix), prefix)

  approx = lambda x: pytest.approx(x, abs=1e-6)  # noqa: E731
  assert record([True, True, False]) == {
      "rewards_chosen": approx(0.075), "rewards_rejected": approx(0.2),
      "reward_margin": approx(-0.125), "label_accuracy": approx(2 / 3),
      "logps_chosen": approx(-1.5), "logps_rejected": approx(-4.0),
      "desirable_count": 2.0, "undesirable_count": 1.0}
  assert record([True, True, True]) == {
      "rewards_chosen": approx(0.35 / 3), "label_accuracy": approx(1.0),
      "logps_chosen": approx(-7 / 3), "desirable_count": 3.0, "undesirable_count": 0.0}
  assert record([False, False, False], "eval_") == {
      "eval_rewards_rejected": approx(0.35 / 3), "eval_label_accuracy": approx(0.0),
      "eval_logps_rejected": approx(-7 / 3), "eval_desirable_count": 0.0,
      "eval_undesirable_count": 3.0}
