"""Files the run reads back as JSON, damaged by a user or a crash into valid JSON that Python's
json cannot read: an integer of more than 4,300 digits (a ValueError, not a JSONDecodeError)
or lists nested 100,000 deep (a RecursionError). Each was a traceback; now each is what the
reader does with any other damage (errors.py `json_limit` says which): one sentence
naming the file and how to go on, or a record left out where damaged records are skipped."""

import json

import pytest

from grpo_jax.errors import InputError

DEEP = "[" * 100_000 + "]" * 100_000
BIG = '{"step": ' + "9" * 5_000 + "}"
BAD = {"deep": (DEEP, "is nested too deeply to read"),
       "big": (BIG, "holds an integer of more than 4300 digits, past what Python reads")}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_training_free_library_step_file(case, tmp_path):
  """The newest step file is set aside with its reason when an older one reads; alone, it
  stops the run in the one sentence every unreadable step file gets."""
  from grpo_jax.training_free.library_files import LibraryFiles, LibraryState  # noqa: PLC0415
  text, said = BAD[case]
  library = LibraryFiles(str(tmp_path))
  library.save(LibraryState(1, {"G0": "check the carry"}))
  (library.directory / "step_2.json").write_text(text)
  state, damaged = library.newest()
  assert state == LibraryState(1, {"G0": "check the carry"})
  assert [(d.step, d.reason) for d in damaged] == [(2, f"it {said}")]
  (library.directory / "step_1.json").unlink()
  with pytest.raises(InputError) as e:
    library.newest()
  assert str(e.value) == (f"{library.directory}/step_2.json cannot be read as a library (it "
                          f"{said}), nor can any older step file of that folder; restore it, "
                          f"delete the folder's step_*.json files to start the library over, "
                          f"or pass another --workdir.")


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_workdirs_config_and_run_info(case, tmp_path):
  """config.json and run_info.json of a workdir with checkpoints: RecordDamaged, saying why."""
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.train.run import resume_guards, workdir as workdir_lib  # noqa: PLC0415
  text, said = BAD[case]
  for name in ("config.json", "run_info.json"):
    (tmp_path / name).write_text(text)
  with pytest.raises(workdir_lib.RecordDamaged) as e:
    workdir_lib.config_changes(get_defaults(), str(tmp_path))
  assert str(e.value).startswith(f"{tmp_path}/config.json is damaged (it {said}), so the "
                                 f"config its checkpoints were made with cannot be checked; "
                                 f"restore the file,")
  with pytest.raises(workdir_lib.RecordDamaged, match=rf"run_info.json is damaged \(it {said}\)"):
    workdir_lib.record_changes(str(tmp_path), {})
  assert resume_guards.recorded(str(tmp_path), "stage") is None  # (the record says nothing)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_metrics_line_is_left_out_like_a_line_cut_short(case, tmp_path):
  """metrics.jsonl's reader, its trim on resume and the check that it reaches the newest
  checkpoint each skip such a line, as they skip a record a kill cut short."""
  from grpo_jax.train.run import metrics, resume_guards, summary  # noqa: PLC0415
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0}\n' + BAD[case][0] + '\n{"step": 1}\n')
  assert summary.read_records(str(tmp_path)) == [{"step": 0}, {"step": 1}]
  (tmp_path / "checkpoints" / "1").mkdir(parents=True)
  resume_guards.check_records_reach_checkpoint(str(tmp_path))  # step 1 is recorded
  assert metrics.keep_records_until(str(path), 1) == 1
  assert path.read_text() == '{"step": 0}\n{"step": 1}\n'


@pytest.mark.parametrize("line", [b'{"step": 3, "loss": \xff\xfe\x00', b'{"step": Infinity}',
                                  b'{"step": 1e400}'], ids=["not_utf8", "inf", "1e400"])
def test_a_metrics_line_of_bytes_or_an_infinite_step_is_left_out(line, tmp_path):
  """Bytes that are not UTF-8 stopped the resume with a UnicodeDecodeError, an infinite step
  with an OverflowError; both lines are left out like a line cut short."""
  from grpo_jax.train.run import metrics, resume_guards, summary  # noqa: PLC0415
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(b'{"step": 0}\n{"step": 1}\n' + line + b"\n")
  assert summary.read_records(str(tmp_path))[:2] == [{"step": 0}, {"step": 1}]
  (tmp_path / "checkpoints" / "1").mkdir(parents=True)
  resume_guards.check_records_reach_checkpoint(str(tmp_path))  # step 1 is recorded
  assert metrics.keep_records_until(str(path), 1) == 1
  assert path.read_text() == '{"step": 0}\n{"step": 1}\n'


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_checkpoint_folders_config_and_index(case, tmp_path):
  """A model folder's config.json (read by the tokenizer, the model loader and the vision
  policy's check for a Qwen2.5-VL folder) and its safetensors index: the one sentence a
  config.json that is not JSON gets."""
  from grpo_jax.data.tokenizer import load_hf_tokenizer  # noqa: PLC0415
  from grpo_jax.models import hf  # noqa: PLC0415
  from grpo_jax.models.vision.build import holds_vl_checkpoint  # noqa: PLC0415
  text, said = BAD[case]
  (tmp_path / "config.json").write_text(text)
  sentence = f"{tmp_path}/config.json {said}; restore the checkpoint's own config.json."
  for read in (lambda: hf.read_config(tmp_path), lambda: load_hf_tokenizer(str(tmp_path)),
               lambda: holds_vl_checkpoint(str(tmp_path))):
    with pytest.raises(InputError) as e:
      read()
    assert str(e.value) == sentence
  index = tmp_path / "model.safetensors.index.json"
  index.write_text(text)
  with pytest.raises(InputError) as e:
    hf._weight_map(tmp_path)
  assert str(e.value) == (f"{index} is not a safetensors index (a JSON object whose weight_map "
                          f"maps tensor names to files; it {said}): download or export the "
                          f"checkpoint again.")
  index.write_text(json.dumps({"metadata": {}}))  # (no weight_map: its type named once)
  with pytest.raises(InputError, match=r"files; KeyError: 'weight_map'\): download"):
    hf._weight_map(tmp_path)
