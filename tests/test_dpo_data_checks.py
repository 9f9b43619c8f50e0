"""The DPO stage's preference files are read and checked whole before any compute
(grpo_jax/data/preference_files.py; docs/dpo.md): each problem one sentence naming the file and
the line; identical pairs counted and refused or skipped; the SFT reader names a non-UTF-8
line; a resume refuses a rewritten data file and another stage's checkpoints
(grpo_jax/train/run/resume_guards.py). Functions called on small files in tmp_path, and one
in-process command showing that nothing is written to the workdir."""

import json
import os

import pytest

from grpo_jax.data import preference_files as pf
from grpo_jax.data.supervised import read_jsonl
from grpo_jax.errors import ConfigError, InputError
from grpo_jax.train.run import resume_guards, workdir as workdir_lib

PAIRS = [{"prompt": f"1{i}+2{i}=", "chosen": str(33 + 2 * i), "rejected": str(34 + 2 * i)}
         for i in range(5)]
UNPAIRED = [{"prompt": "11+22=", "completion": "33", "label": True},
            {"prompt": "11+22=", "completion": "34", "label": False}]


@pytest.fixture(scope="module")
def task():
  from configs import dpo_tiny  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  return build_task(dpo_tiny.get_config(), lambda *a: None)


def _file(tmp_path, records=None, raw=None, name="pairs.jsonl"):
  path = tmp_path / name
  path.write_bytes(raw if raw is not None else
                   "".join(json.dumps(r) + "\n" for r in records).encode())
  return str(path)


def _tokenized(path, task, loss="dpo", on_degenerate="refuse", limits=pf.Limits(512, 4),
               log=None):
  f = pf.read_preference_file("dpo.train_path", path, loss)
  return pf.tokenize_preference_file(f, task, limits, on_degenerate,
                                     log or (lambda *a: None)).data


def _lines(records):
  return [json.dumps(r).encode() for r in records]


@pytest.mark.parametrize("case, raw, loss, needles", [
    ("missing field (D01)", _lines(PAIRS[:2] + [{"prompt": "1+1=", "rejected": "3"}]), "dpo",
     ["line 3 has no 'chosen' field"]),
    ("a number (D12)", _lines([{**PAIRS[0], "chosen": 46}]), "dpo",
     ["line 1 has chosen=46 (a number), not a string"]),
    ("KTO after pairs (D13)", _lines(PAIRS[:3] + UNPAIRED[:1]), "kto",
     ["line 4 is an unpaired", "but line 1 is a {prompt, chosen, rejected} pair"]),
    ("label a string (D14)", _lines([{**UNPAIRED[0], "label": "true"}]), "kto",
     ["line 1 has label='true' (a string), not true or false"]),
    ("first line paired (D16)", _lines(PAIRS[:1] + UNPAIRED), "kto", ["line 2 is an unpaired"]),
    ("not UTF-8 (D05)", _lines(PAIRS[:3]) + [_lines(PAIRS[3:4])[0].replace(b'"1', b'"\xff')],
     "dpo", ["line 4 is not UTF-8 text (byte 0xff"]),
    ("not JSON", _lines(PAIRS[:1]) + [b"{prompt: 1}"], "dpo", ["line 2 is not JSON"]),
    ("a 5,000-digit integer", _lines(PAIRS[:1]) + [b'{"n": ' + b"9" * 5000 + b"}"], "dpo",
     ["line 2 holds an integer of more than 4300 digits, past what Python reads; write it as "
      "a string."]),
    ("nested 100,000 deep", _lines(PAIRS[:1]) + [b"[" * 100_000 + b"]" * 100_000], "dpo",
     ["line 2 is nested too deeply to read; flatten its lists and objects."]),
    ("a lone surrogate (issue 77)", _lines(PAIRS[:1]) + [_lines(PAIRS[1:2])[0].replace(
        b'"1', b'"\\udc80')], "dpo",
     ["line 2 has text that is not valid Unicode in", "lone surrogate \\udc80"]),
    ("not an object", _lines(PAIRS[:1]) + [b"[1, 2]"], "dpo", ["line 2 holds a list"]),
    ("empty (D11)", [], "dpo", ["holds no records"]),
    ("blank lines only", [b"", b"  "], "dpo", ["holds no records"])])
def test_a_bad_file_is_one_sentence_naming_the_file_and_line(case, raw, loss, needles, tmp_path):
  path = _file(tmp_path, raw=b"\n".join(raw) + (b"\n" if raw else b""))
  with pytest.raises(InputError) as e:
    pf.read_preference_file("dpo.train_path", path, loss)
  message = str(e.value)
  assert path in message and len(message.splitlines()) == 1, message
  for needle in needles:
    assert needle in message, (needle, message)


def test_a_missing_path_a_folder_and_unpaired_records_for_dpo(tmp_path):
  """D17, D18: the config field and the path named; KTO's records with another loss."""
  with pytest.raises(InputError, match="dpo.train_path=.*nope.jsonl: no such file"):
    pf.read_preference_file("dpo.train_path", str(tmp_path / "nope.jsonl"), "dpo")
  with pytest.raises(InputError, match="is a folder, not a file"):
    pf.read_preference_file("dpo.train_path", str(tmp_path), "dpo")
  with pytest.raises(ConfigError, match="only dpo.loss='kto' trains on"):
    pf.read_preference_file("dpo.train_path", _file(tmp_path, UNPAIRED), "dpo")


def test_a_good_file_is_read_with_its_lines_and_fingerprint(tmp_path, task):
  """Blank lines skipped (line numbers kept), a UTF-8 BOM accepted, the sha256 of the bytes."""
  raw = b"\xef\xbb\xbf" + b"\n\n".join(_lines(PAIRS)) + b"\n"
  path = _file(tmp_path, raw=raw)
  f = pf.read_preference_file("dpo.train_path", path, "dpo")
  assert f.format == pf.PAIRS and f.lines == (1, 3, 5, 7, 9)
  assert f.sha256 == resume_guards.sha256_of(path)
  assert len(pf.tokenize_preference_file(f, task, pf.Limits(512, 4)).data) == 5
  unpaired = pf.read_preference_file("dpo.train_path", _file(tmp_path, UNPAIRED, name="u"), "kto")
  data = pf.tokenize_preference_file(unpaired, task, pf.Limits(512, 4)).data
  assert unpaired.unpaired and data.labels.tolist() == [True, False]


def test_a_character_outside_the_tokenizer_and_a_long_prompt_name_the_line(tmp_path, task):
  """D07: the file, the line, the field and the character; D08: the prompt's token count
  against data.max_prompt_tokens, and prompt + rollout.max_new_tokens against the model's
  positions."""
  letters = _file(tmp_path, PAIRS[:1] + [{**PAIRS[1], "prompt": "What is 12+34?"}])
  with pytest.raises(InputError, match=r"line 2: the prompt cannot be tokenised \(character "
                                       r"'W'"):
    _tokenized(letters, task)
  rejected = _file(tmp_path, [{**PAIRS[0], "rejected": "4x"}], name="r")
  with pytest.raises(InputError, match="line 1: the rejected cannot be tokenised"):
    _tokenized(rejected, task)
  long = _file(tmp_path, PAIRS[:2] + [{**PAIRS[2], "prompt": "1" * 600 + "+1="}], name="l")
  with pytest.raises(InputError, match=r"line 3 has a prompt of 604 tokens, more than "
                                       r"data.max_prompt_tokens=512"):
    _tokenized(long, task)
  f = pf.read_preference_file("dpo.train_path", _file(tmp_path, PAIRS[:1] + [
      {**PAIRS[1], "prompt": "123+456="}], name="p"), "dpo")
  t = pf.tokenize_preference_file(f, task, pf.Limits(512, 4))
  pf.check_fits_positions(f, t, 4, 13)
  with pytest.raises(InputError, match=r"line 2 has a prompt of 9 tokens, which with "
                                       r"rollout.max_new_tokens=4 needs 13 positions, more than "
                                       r"the model's max_position_embeddings=12"):
    pf.check_fits_positions(f, t, 4, 12)


def test_identical_or_empty_pairs_are_refused_or_skipped_with_a_count(tmp_path, task):
  """D03, D04: pairs whose completions are the same in the tokens training reads (identical,
  both empty, or equal in their first rollout.max_new_tokens tokens) are counted: refused in
  one sentence (the file, the count, the first line) or, with 'skip', dropped and the count
  printed; a file of nothing else is refused either way."""
  records = [PAIRS[0], {**PAIRS[1], "rejected": PAIRS[1]["chosen"]}, PAIRS[2],
             {**PAIRS[3], "chosen": "", "rejected": ""},
             {**PAIRS[4], "chosen": "12345", "rejected": "12346"}]  # equal in 4 tokens
  path = _file(tmp_path, records)
  with pytest.raises(InputError, match=r"3 of its 5 pairs have the same chosen and rejected "
                                       r"completion .*1 of them both empty\), the first at line "
                                       r"2; .*dpo.on_degenerate_pair='skip'"):
    _tokenized(path, task)
  lines = []
  data = _tokenized(path, task, on_degenerate="skip", log=lines.append)
  assert len(data) == 2 and "skipped" in lines[0] and "3 of its 5 pairs" in lines[0]
  empty = _file(tmp_path, [{**r, "chosen": "", "rejected": ""} for r in PAIRS], name="e")
  with pytest.raises(InputError, match=r"5 of its 5 pairs .*would leave no pairs"):
    _tokenized(empty, task, on_degenerate="skip")


def test_a_blank_prompt_under_gsm8k_names_the_line(tmp_path):
  """GSM8K's own check of the prompt (a BadRow) is the InputError naming the file and line."""
  from grpo_jax.data.gsm8k import GSM8KTask  # noqa: PLC0415
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.envs.char_tokenizer import char_chat_tokenizer  # noqa: PLC0415
  for split in ("train", "test"):
    _file(tmp_path, [{"question": "What is 1+1?", "answer": "so\n#### 2"}], name=f"{split}.jsonl")
  data = get_defaults().data.copy_and_resolve_references()
  data.update(dict(path=str(tmp_path), prompt_field="question", answer_field="gold"))
  task = GSM8KTask(data, char_chat_tokenizer(), (), 16, lambda *a: None)
  path = _file(tmp_path, [PAIRS[0], {**PAIRS[1], "prompt": "  "}])
  with pytest.raises(InputError) as e:
    _tokenized(path, task)
  assert str(e.value) == f"{path} line 2 has an empty prompt; rewrite or remove that line."


def test_the_sft_reader_names_a_non_utf8_line_and_a_folder(tmp_path):
  """R01 (and warmup.data_path's folder): one sentence each."""
  raw = b'{"prompt": "1+1=", "response": "2"}\n{"prompt": "\xff", "response": "2"}\n'
  with pytest.raises(InputError, match=r"sft.jsonl line 2 is not UTF-8 text"):
    read_jsonl(_file(tmp_path, raw=raw, name="sft.jsonl"), ("prompt", "response"))
  with pytest.raises(InputError, match=r"warmup.data_path=.* is a folder"):
    read_jsonl(str(tmp_path), ("prompt", "response"), "warmup.data_path")


DEVICES = {"platform": "cpu", "kind": "cpu", "count": 1, "processes": 1, "mesh": None}


def _recorded_run(tmp_path, stage, data=None):
  """A workdir whose config and first start are recorded, as a stage leaves them."""
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  config = get_defaults()
  workdir = tmp_path / "run"
  workdir_lib.write_config(config, str(workdir))
  workdir_lib.record_start(str(workdir), None, {}, DEVICES, stage=stage, data=data)
  return config, str(workdir)


def test_a_rewritten_data_file_is_refused_on_resume_like_a_changed_config(tmp_path):
  """D21: the file's sha256 is recorded with the start; on resume another one is one sentence
  naming the field, the file and the ways on; train.allow_config_change lets it through as a
  recorded change; an unchanged file, or a record without fingerprints, is no change."""
  path = _file(tmp_path, PAIRS)
  data = resume_guards.file_fingerprints({"dpo.train_path": path, "dpo.test_path": ""})
  config, workdir = _recorded_run(tmp_path, "dpo", data)
  assert workdir_lib.open_records([config], [workdir], True, DEVICES, stage="dpo",
                                  data=data) == [{}]
  _file(tmp_path, [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in PAIRS])
  now = resume_guards.file_fingerprints({"dpo.train_path": path})
  with pytest.raises(ConfigError, match=rf"dpo.train_path={path} changed since the run recorded "
                                        rf"it .*allow_config_change=True"):
    workdir_lib.open_records([config], [workdir], True, DEVICES, stage="dpo", data=now)
  config.train.allow_config_change = True
  changes = workdir_lib.open_records([config], [workdir], True, DEVICES, log=lambda *a: None,
                                     stage="dpo", data=now)
  assert changes[0]["sha256 of dpo.train_path"] == [data["dpo.train_path"]["sha256"],
                                                    now["dpo.train_path"]["sha256"]]
  assert resume_guards.data_changes(str(tmp_path / "none"), now, False) == {}


def test_another_stages_checkpoints_are_never_resumed(tmp_path):
  """D22, D23: a DPO run in a workdir of an RL run is refused naming both stages, even with
  train.allow_config_change; a record from before stages were recorded is not checked."""
  config, workdir = _recorded_run(tmp_path, "rl")
  config.train.allow_config_change = True
  with pytest.raises(ConfigError, match=r"holds checkpoints of the rl stage .*the dpo stage "
                                        r"cannot resume, not even with"):
    workdir_lib.open_records([config], [workdir], True, DEVICES, stage="dpo")
  workdir_lib.open_records([config], [workdir], True, DEVICES, stage="rl")
  config, legacy = _recorded_run(tmp_path / "legacy", None)
  workdir_lib.open_records([config], [legacy], True, DEVICES, stage="dpo")


def test_the_command_stops_before_anything_is_written(tmp_path, capfd):
  """The whole stage, by its command (in-process): a character outside the tokenizer, which
  only the tokenizer finds, is one line with exit status 2 and no workdir at all (before the
  warm-up, the step-0 evaluation and checkpoint 0)."""
  from grpo_jax.main import cli  # noqa: PLC0415
  path = _file(tmp_path, PAIRS[:3] + [{**PAIRS[3], "chosen": "forty"}])
  workdir = tmp_path / "w"
  config = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "dpo_tiny.py")
  code = cli(["--stage=dpo", f"--config={config}", f"--workdir={workdir}",
              f"--config.dpo.train_path={path}", f"--config.dpo.test_path={path}"])
  err = capfd.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "line 4: the chosen cannot be tokenised" in err[0], err
  assert not workdir.exists()
