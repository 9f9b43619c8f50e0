"""The SFT and RM stages (grpo_jax/train/stages/supervised.py) against the run options the RL
stage honours: train.export_dtype and train.export_max_shard_mb shape their exports, lora.rank
is refused before any compute, train.wandb_project gets a W&B run, and a finished SFT run says
how a longer one starts. One or two steps of the tiny model each."""

import json
import os
import struct

import numpy as np
import pytest

from configs import rlhf_tiny_sft
from grpo_jax.errors import ConfigError
from grpo_jax.train.stages.supervised import train_reward_model, train_sft
from tests.fixtures import with_fields

quiet = lambda *a, **k: None  # noqa: E731


def _sft(**fields):
  return with_fields(rlhf_tiny_sft.get_config(), {
      "warmup.steps": 1, "warmup.batch_size": 8, "train.eval_size": 8,
      "train.eval_batch_size": 8, "train.num_samples": 0, "train.checkpoint_every": 0,
      **fields})


def _rm(**fields):
  return _sft(**{"warmup.steps": 0, "rm.steps": 1, "rm.batch_size": 8, "rm.eval_every": 1,
                 "rm.train_pairs": 16, "rm.test_pairs": 8, "rm.policy_fraction": 0.0, **fields})


def _dtypes(folder) -> tuple[set, list]:
  """(the dtypes of every tensor, the safetensors files) of an exported folder."""
  names = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
  dtypes = set()
  for name in names:
    with open(os.path.join(folder, name), "rb") as f:
      header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    dtypes |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
  return dtypes, names


EXPORT = {"train.export_dtype": "bfloat16", "train.export_max_shard_mb": 0.25}


def test_sft_export_has_the_dtype_and_shards_asked_for(tmp_path):
  train_sft(_sft(**EXPORT), str(tmp_path), log=quiet)
  out = tmp_path / "hf_export"
  dtypes, names = _dtypes(out)
  assert dtypes == {"BF16"} and len(names) > 1, (dtypes, names)
  assert (out / "model.safetensors.index.json").is_file()
  config = json.loads((out / "config.json").read_text())
  assert config.get("torch_dtype", config.get("dtype")) == "bfloat16"


def test_reward_model_export_has_the_dtype_and_shards_asked_for(tmp_path):
  from grpo_jax.models.reward_model import load_reward_model  # noqa: PLC0415
  state = train_reward_model(_rm(**EXPORT), str(tmp_path), log=quiet)
  out = tmp_path / "hf_export"
  dtypes, names = _dtypes(out)
  assert dtypes == {"BF16"} and len(names) > 1, (dtypes, names)
  _, params, labels = load_reward_model(out)  # read back, shards and all
  assert labels == 1
  np.testing.assert_allclose(np.asarray(params["score"]["kernel"]),
                             np.asarray(state.params["score"]["kernel"]), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("stage", [train_sft, train_reward_model])
def test_lora_is_refused_before_anything_is_written(stage, tmp_path):
  config = (_sft if stage is train_sft else _rm)(**{"lora.rank": 4})
  with pytest.raises(ConfigError, match=r"^lora\.rank=4: the (sft|rm) stage trains every "):
    stage(config, str(tmp_path / "run"), log=quiet)
  assert not (tmp_path / "run").exists()


def test_a_finished_sft_run_says_a_longer_one_needs_a_fresh_workdir(tmp_path):
  train_sft(_sft(), str(tmp_path), log=quiet)
  lines = []
  train_sft(_sft(), str(tmp_path), log=lines.append)
  (line,) = [x for x in lines if "this run is finished" in x]
  assert line.endswith("nothing to do; a longer sft run needs a fresh --workdir (its learning "
                       "rate's schedule spans its length)"), line
  with pytest.raises(ConfigError, match=r"warmup\.steps 1 -> 2"):  # as the line says
    train_sft(_sft(**{"warmup.steps": 2}), str(tmp_path), log=quiet)


def test_a_finished_run_names_how_a_longer_one_starts_by_its_schedule():
  """The RL stage said "a larger train.steps continues it" under optim.schedule 'linear' or
  'cosine' too, whose resume refuses a new train.steps (its decay spans the run)."""
  from configs import grpo_tiny  # noqa: PLC0415
  from grpo_jax.train.run.summary import longer_run  # noqa: PLC0415
  config = grpo_tiny.get_config()
  assert longer_run("rl", ("train.steps",), config) == (
      "a larger train.steps continues it, a fresh --workdir starts a new one")
  for schedule in ("linear", "cosine"):
    config.optim.schedule = schedule
    assert longer_run("rl", ("train.steps",), config) == (
        "a longer rl run needs a fresh --workdir (its learning rate's schedule spans its length)")
