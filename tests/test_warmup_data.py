"""The warm-up's data (train/stages/warmup.py `warmup_data`): with warmup.data_path, the RL and
DPO stages' warm-ups learn from that file, as the SFT stage does; a file's text that the
tokenizer cannot encode is one sentence naming its line in every stage that reads one; the
reward model's pair files are checked as DPO's are (data/preference_files.py)."""

import re

import pytest

from configs import dpo_tiny, grpo_tiny, rlhf_tiny_rm
from grpo_jax.data.supervised import addition_preference_pairs, write_jsonl
from grpo_jax.errors import InputError
from grpo_jax.train.run.setup import build_task
from tests.fixtures import with_fields

LOSS = re.compile(r"^(?:warm-up|sft step) +(\d+)/\d+ \| sft loss (\d+\.\d+)")


def _set(config, **fields):
  """with_fields with field names written a__b for a.b (keyword arguments)."""
  return with_fields(config, {k.replace("__", "."): v for k, v in fields.items()})


def _losses(lines):
  return [LOSS.match(line).groups() for line in lines if LOSS.match(line)]


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory):
  """{prompt, response} lines of the addition task with the right sums (the task's own
  warm-up data drops the carries 9 times in 10: another loss)."""
  path = tmp_path_factory.mktemp("warmup") / "sft.jsonl"
  pairs = addition_preference_pairs(build_task(grpo_tiny.get_config()), "train", 64, 0)
  write_jsonl(str(path), [{"prompt": p["prompt"], "response": p["chosen"]} for p in pairs])
  return str(path)


def test_the_rl_warm_up_learns_from_warmup_data_path_as_the_sft_stage_does(sft_file, tmp_path):
  """The same model, seed, steps and file: the RL stage's warm-up prints the SFT stage's
  losses (before, the RL warm-up never opened the file: the task's data gave other losses)."""
  from grpo_jax.train.stages.rl import train
  from grpo_jax.train.stages.supervised import train_sft
  small = dict(warmup__steps=10, warmup__batch_size=16, train__eval_size=8,
               train__eval_batch_size=8)
  sft = []
  train_sft(_set(grpo_tiny.get_config(), warmup__data_path=sft_file, **small),
            str(tmp_path / "sft"), log=sft.append)
  rl_small = dict(small, train__steps=1, rollout__num_prompts=2, rollout__group_size=2)
  rl = []
  train(_set(grpo_tiny.get_config(), warmup__data_path=sft_file, **rl_small),
        str(tmp_path / "rl"), log=rl.append)
  assert len(_losses(sft)) == 5 and _losses(rl) == _losses(sft), (rl, sft)
  assert (tmp_path / "rl" / "run_info.json").read_text().count(sft_file) == 1  # its fingerprint


def test_a_missing_warmup_file_stops_rl_and_dpo_before_any_compute(tmp_path):
  missing = str(tmp_path / "nowhere.jsonl")
  from grpo_jax.train.stages.preference import train_dpo
  from grpo_jax.train.stages.rl import train
  for stage, config in ((train, grpo_tiny.get_config()), (train_dpo, dpo_tiny.get_config())):
    _set(config, warmup__steps=5, warmup__data_path=missing)
    with pytest.raises(InputError, match=f"warmup.data_path={missing}: no such file"):
      stage(config, str(tmp_path / stage.__name__), log=lambda *a: None)
    assert not (tmp_path / stage.__name__ / "metrics.jsonl").exists()


def test_untokenisable_text_in_an_sft_or_reward_model_file_is_one_sentence(tmp_path):
  """Before, both stages ended in the tokenizer's ValueError traceback (the reward model's
  after building the model)."""
  from grpo_jax.train.stages.supervised import train_reward_model, train_sft
  sft, pairs = tmp_path / "sft.jsonl", tmp_path / "pairs.jsonl"
  write_jsonl(str(sft), [{"prompt": "1+2=", "response": "3"}, {"prompt": "4+6=", "response": "1 0"}])
  write_jsonl(str(pairs), [{"prompt": "1+2=", "chosen": "3", "rejected": "4"},
                           {"prompt": "4x6=", "chosen": "01", "rejected": "11"}])
  with pytest.raises(InputError, match=re.escape(f"{sft} line 2: the response cannot be "
                                                 f"tokenised (character ' '")):
    train_sft(_set(grpo_tiny.get_config(), warmup__steps=2, warmup__data_path=str(sft)),
              str(tmp_path / "sft"), log=lambda *a: None)
  config = _set(rlhf_tiny_rm.get_config(str(tmp_path)), model__path="", rm__steps=2,
                rm__train_path=str(pairs), rm__test_path=str(pairs))
  with pytest.raises(InputError, match=re.escape(f"{pairs} line 2: the prompt cannot be "
                                                 f"tokenised (character 'x'")):
    train_reward_model(config, str(tmp_path / "rm"), log=lambda *a: None)


def test_the_sft_stage_on_an_environment_task_evaluates_episodes_and_learns_its_own_tokens(
    tmp_path):
  """The SFT stage built the plain evaluator, whose scoring an environment's task does not
  take ("the reward function raised TypeError"), and dropped the batch's loss_mask, so with
  task.warmup_loss="assistant" it learned the tool's tokens too."""
  import json  # noqa: PLC0415

  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.train.stages.supervised import stage_model, train_sft  # noqa: PLC0415
  from grpo_jax.train.stages.warmup import sft_loss  # noqa: PLC0415
  config = _set(grpo_calculator_tiny.get_config(), warmup__steps=1, warmup__batch_size=8,
                train__eval_size=2, train__eval_batch_size=2, task__test_size=2)
  train_sft(config, str(tmp_path / "sft"), log=lambda *a: None)
  records = [json.loads(line) for line in open(tmp_path / "sft" / "metrics.jsonl")]
  assert "eval_turns_per_episode" in records[0]  # the episode evaluator's
  task = build_task(config, lambda *a: None)
  _, _, model_cfg, params, _ = stage_model(config, task)
  b = task.warmup_batch(0, 8, int(config.seed), None)
  fields = (params, model_cfg, b.prompt_tokens, b.prompt_mask, b.target_tokens, b.target_mask)
  assistant, every = float(sft_loss(*fields, b.loss_mask)), float(sft_loss(*fields))
  assert abs(assistant - every) > 1e-3  # the mask matters on this batch
  assert records[1]["sft_loss"] == pytest.approx(assistant, abs=1e-6)


def test_a_reward_model_file_with_identical_pairs_is_refused_naming_the_first_line(tmp_path):
  """A pair whose chosen completion is its rejected one has no preference (its Bradley-Terry
  loss is a constant, its gradient zero); the RM stage read the file with no such check and
  trained on it. Now the pairs go through DPO's check: one sentence, before any compute."""
  from grpo_jax.train.stages.supervised import train_reward_model
  pairs = tmp_path / "pairs.jsonl"
  write_jsonl(str(pairs), [{"prompt": "1+2=", "chosen": "3", "rejected": "4"},
                           {"prompt": "2+2=", "chosen": "4", "rejected": "4"},
                           {"prompt": "3+2=", "chosen": "5", "rejected": "5"}])
  config = _set(rlhf_tiny_rm.get_config(str(tmp_path)), model__path="", rm__steps=2,
                rm__train_path=str(pairs), rm__test_path=str(pairs))
  with pytest.raises(InputError) as e:
    train_reward_model(config, str(tmp_path / "rm"), log=lambda *a: None)
  assert str(e.value) == (
      f"rm.train_path={pairs}: 2 of its 3 pairs have the same chosen and rejected completion "
      f"in the 4 tokens training reads (rollout.max_new_tokens), the first at line 2; such "
      f"pairs teach nothing (their Bradley-Terry loss is a constant, their gradient is zero): "
      f"fix the file.")
  assert not (tmp_path / "rm" / "metrics.jsonl").exists()
  write_jsonl(str(pairs), [{"prompt": "1+2=", "completion": "3", "label": True}])
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  with pytest.raises(ConfigError, match=r"only dpo.loss='kto' trains on \(the reward model "
                                        r"trains on pairs\); give \{prompt, chosen, rejected"):
    train_reward_model(config, str(tmp_path / "rm"), log=lambda *a: None)


def test_a_prompt_over_max_prompt_tokens_in_an_sft_or_reward_model_file_names_its_line(tmp_path):
  """The SFT and RM stages padded every batch to the file's longest prompt whatever its length
  (DPO's files and the RL tasks' rows were held to data.max_prompt_tokens); now both refuse it
  in DPO's sentence, before any compute."""
  from grpo_jax.train.stages.supervised import train_reward_model, train_sft
  sft, pairs = tmp_path / "sft.jsonl", tmp_path / "pairs.jsonl"
  long = "1" * 30 + "+2="
  write_jsonl(str(sft), [{"prompt": "1+2=", "response": "3"}, {"prompt": long, "response": "3"}])
  write_jsonl(str(pairs), [{"prompt": "1+2=", "chosen": "3", "rejected": "4"},
                           {"prompt": long, "chosen": "3", "rejected": "4"}])
  tokens = len(build_task(grpo_tiny.get_config()).supervised_example(long, "3")[0])
  sentence = (f"line 2 has a prompt of {tokens} tokens, more than data.max_prompt_tokens=20; "
              f"shorten or remove that line, or raise data.max_prompt_tokens.")
  with pytest.raises(InputError) as e:
    train_sft(_set(grpo_tiny.get_config(), warmup__steps=2, warmup__data_path=str(sft),
                   data__max_prompt_tokens=20), str(tmp_path / "sft"), log=lambda *a: None)
  assert tokens >= 33 and str(e.value) == f"{sft} {sentence}"
  config = _set(rlhf_tiny_rm.get_config(str(tmp_path)), model__path="", rm__steps=2,
                rm__train_path=str(pairs), rm__test_path=str(pairs), data__max_prompt_tokens=20)
  with pytest.raises(InputError) as e:
    train_reward_model(config, str(tmp_path / "rm"), log=lambda *a: None)
  assert str(e.value) == f"{pairs} {sentence}"
  for stage in ("sft", "rm"):
    assert not (tmp_path / stage / "metrics.jsonl").exists()


def test_a_reward_model_file_past_the_models_positions_names_its_line(tmp_path, monkeypatch):
  """DPO refused a prompt whose tokens with rollout.max_new_tokens need more positions than the
  model's max_position_embeddings; the RM stage, which reads its pairs with the same reader,
  trained on them. Now the same sentence, once the model is built and before any step."""
  import dataclasses  # noqa: PLC0415

  from grpo_jax.train.stages import supervised  # noqa: PLC0415
  pairs = tmp_path / "pairs.jsonl"
  write_jsonl(str(pairs), [{"prompt": "1+2=", "chosen": "3", "rejected": "4"},
                           {"prompt": "11+22=", "chosen": "33", "rejected": "34"}])
  built = supervised.build_model
  monkeypatch.setattr(supervised, "build_model", lambda *a: (
      lambda cfg, params: (dataclasses.replace(cfg, max_position_embeddings=9), params))(
          *built(*a)))
  config = _set(rlhf_tiny_rm.get_config(str(tmp_path)), model__path="", rm__steps=2,
                rm__train_path=str(pairs), rm__test_path=str(pairs))
  tokens = len(build_task(config).supervised_example("11+22=", "33")[0])
  n = config.rollout.max_new_tokens
  assert tokens + n > 9
  with pytest.raises(InputError) as e:
    supervised.train_reward_model(config, str(tmp_path / "rm"), log=lambda *a: None)
  assert str(e.value) == (
      f"{pairs} line 2 has a prompt of {tokens} tokens, which with rollout.max_new_tokens={n} "
      f"needs {tokens + n} positions, more than the model's max_position_embeddings=9; "
      f"shorten or remove that line, or lower rollout.max_new_tokens.")
  assert not (tmp_path / "rm" / "metrics.jsonl").exists()


@pytest.mark.parametrize("stage", ["sft", "rl", "dpo"])
def test_a_warmup_file_past_the_models_positions_names_its_line(stage, tmp_path, monkeypatch):
  """A warmup.data_path prompt whose tokens with rollout.max_new_tokens need more positions than
  the model's max_position_embeddings: the sentence the RM and DPO pair files get, once the model
  is built and before any step or record (the SFT stage and the RL and DPO warm-ups trained on
  it)."""
  import dataclasses  # noqa: PLC0415

  from grpo_jax.train.stages import preference, rl, supervised  # noqa: PLC0415
  data = tmp_path / "sft.jsonl"
  write_jsonl(str(data), [{"prompt": "12+34=", "response": "46"},
                          {"prompt": "1111111111+2=", "response": "1113"}])
  module, run = {"sft": (supervised, supervised.train_sft), "rl": (rl, rl.train),
                 "dpo": (supervised, preference.train_dpo)}[stage]
  built = module.build_model
  monkeypatch.setattr(module, "build_model", lambda *a: (
      lambda cfg, params: (dataclasses.replace(cfg, max_position_embeddings=12), params))(
          *built(*a)))
  config = _set(dpo_tiny.get_config() if stage == "dpo" else grpo_tiny.get_config(),
                warmup__steps=2, warmup__batch_size=2, warmup__data_path=str(data),
                train__eval_size=8, train__eval_batch_size=8, train__num_samples=0,
                train__steps=1, dpo__steps=1, dpo__eval_every=1)
  tokens = len(build_task(config).supervised_example("1111111111+2=", "1113")[0])
  n = config.rollout.max_new_tokens
  assert tokens + n > 12
  with pytest.raises(InputError) as e:
    run(config, str(tmp_path / "w"), log=lambda *a: None)
  assert str(e.value) == (
      f"{data} line 2 has a prompt of {tokens} tokens, which with rollout.max_new_tokens={n} "
      f"needs {tokens + n} positions, more than the model's max_position_embeddings=12; "
      f"shorten or remove that line, or lower rollout.max_new_tokens.")
  assert not (tmp_path / "w" / "metrics.jsonl").exists()
