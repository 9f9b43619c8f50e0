"""What a resume refuses before it writes anything, beyond a changed config
(grpo_jax/train/run/resume_guards.py, workdir.check_resume_config): records that stop short of
the newest checkpoint, and a change that alters what the checkpoints hold (round 5's cases)."""

import pytest

from grpo_jax.config import ConfigError
from tests.tiny_runs import N, ROOT
from tests.tiny_runs import command as _command


def test_records_that_stop_short_of_the_newest_checkpoint_are_refused(reference, tmp_path,
                                                                      capfd):
  """Round 5's hole in metrics.jsonl: its tail lost (a full disk, a copy cut short) while the
  checkpoints are intact. A resume would write the steps after the newest checkpoint and leave
  the lost ones out with no trace; it stops instead, before anything is written, naming both
  steps and the fixes. Following the fix (the newer checkpoints moved aside) it resumes."""
  import shutil  # noqa: PLC0415
  from tests.test_bad_inputs import _expect  # noqa: PLC0415
  ref_dir, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  (workdir / "metrics.jsonl").write_text("\n".join(lines[:N + 1]) + '\n{"step": ' + str(N + 1))
  ckpts = workdir / "checkpoints"
  line = _expect(capfd, [f"--config={ROOT}/configs/grpo_tiny.py", *_command(workdir)[5:]],
                 str(workdir))
  assert line == (
      f"error: resuming {workdir}: metrics.jsonl ends at step {N} (its last intact record), "
      f"but the newest checkpoint is step {2 * N}, so the records of steps {N + 1}-{2 * N} are "
      f"lost and the curves would have a silent gap; put the lost records back (from a copy of "
      f"the file), or resume from checkpoint {N} by moving the newer ones out of {ckpts} (mv "
      f"{ckpts}/{2 * N} <elsewhere>/).")
  from grpo_jax.train.run import resume_guards  # noqa: PLC0415
  shutil.move(str(ckpts / str(2 * N)), str(tmp_path / "aside"))
  resume_guards.check_records_reach_checkpoint(str(workdir))  # the fix: nothing to refuse


def test_a_staleness_change_on_resume_is_refused_even_when_changes_are_allowed():
  """Round 5's A14: rl.max_staleness 2 -> 4 with train.allow_config_change went through to an
  orbax structure mismatch that blamed the model; the in-flight copies are the checkpoint's."""
  from grpo_jax.train.run.workdir import check_resume_config  # noqa: PLC0415
  with pytest.raises(ConfigError, match=r"^resuming W: rl.max_staleness 2 -> 4 changes what its "
                     r"checkpoints hold \(one copy of the parameters per update a batch may "
                     r"lag\), so they cannot be restored, not even with "
                     r"train.allow_config_change; run with rl.max_staleness=2"):
    check_resume_config({"rl.max_staleness": [2, 4], "train.steps": [4, 8]}, "W", allow=True)


DEVICES = {"platform": "cpu", "kind": "cpu", "count": 1, "processes": 1, "mesh": None}


def _stacked_run(workdir, seeds, steps_done, records):
  """What a run of stacked seeds leaves: checkpoints_seeds_<seeds>/<step> and each seed's
  records (steps 0..records-1) in seed_<s>/; returns (its workdirs, its checkpoint folder)."""
  import json  # noqa: PLC0415
  folder = workdir / ("checkpoints_seeds_" + "_".join(map(str, seeds)))
  for step in steps_done:
    (folder / str(step)).mkdir(parents=True)
  workdirs = [workdir / f"seed_{s}" for s in seeds]
  for wd in workdirs:
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n"
                                              for s in range(records)))
  return [str(wd) for wd in workdirs], str(folder)


def _configs(seeds):
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  return [get_defaults().copy_and_resolve_references() for _ in seeds]


def test_stacked_seeds_records_are_checked_against_their_own_checkpoints(tmp_path):
  """The records of stacked seeds (seed_<s>/metrics.jsonl) were compared with a
  seed_<s>/checkpoints folder that never exists, so their lost tail went unnoticed; they are
  compared with the run's checkpoints_seeds_<seeds> folder (train/stages/rl.py passes it)."""
  from grpo_jax.train.run.workdir import open_records  # noqa: PLC0415
  workdirs, folder = _stacked_run(tmp_path, (0, 1), (2, 6), records=3)
  with pytest.raises(ConfigError, match=rf"^resuming {workdirs[0]}: metrics.jsonl ends at step "
                     rf"2 .* newest checkpoint is step 6, .* moving the newer ones out of "
                     rf"{folder} \(mv {folder}/6 <elsewhere>/\)\.$"):
    open_records(_configs((0, 1)), workdirs, True, DEVICES, stage="rl", checkpoints=folder)


def test_a_changed_length_is_free_only_under_a_constant_learning_rate(tmp_path):
  """train.steps 2 -> 4 was free under every optim.schedule, but 'linear' and 'cosine' spread
  their decay over the run's length: the extended run differed from one that ran through."""
  from grpo_jax.train.run import workdir as workdir_lib  # noqa: PLC0415
  changes, logged = {"train.steps": [2, 4]}, []
  with pytest.raises(ConfigError) as err:
    workdir_lib.check_resume_config(changes, "W", allow=False, schedule="linear")
  assert str(err.value) == (
      "resuming W under a config that differs from its config.json (train.steps 2 -> 4), and "
      "optim.schedule='linear' spreads the learning rate's decay over the run's length, so the "
      "run would differ from one that ran through; run with its recorded config, pass another "
      "--workdir, or pass --config.train.allow_config_change=True to resume anyway (the "
      "changes are recorded in run_info.json).")
  workdir_lib.check_resume_config(changes, "W", allow=False, schedule="constant")
  workdir_lib.check_resume_config(changes, "W", allow=True, log=logged.append, schedule="cosine")
  assert logged == ["resuming W with changes allowed by train.allow_config_change: train.steps "
                    "2 -> 4 (recorded in run_info.json)"]
  # a stage's own length (the RM stage's rm.steps); train.steps is not the RM stage's
  with pytest.raises(ConfigError, match=r"\(rm.steps 2 -> 4\), and optim.schedule='cosine'"):
    workdir_lib.check_resume_config({"rm.steps": [2, 4]}, "W", allow=False,
                                    length=("rm.steps",), schedule="cosine")
  workdir_lib.check_resume_config(changes, "W", allow=False, length=("rm.steps",),
                                  schedule="cosine")
  # open_records reads the schedule from the config
  config = _configs((0,))[0]
  config.optim.schedule, config.train.steps = "linear", 2
  workdir_lib.write_config(config, str(tmp_path))
  config.train.steps = 4
  with pytest.raises(ConfigError, match=r"\(train.steps 2 -> 4\), and optim.schedule='linear'"):
    workdir_lib.open_records([config], [str(tmp_path)], True, DEVICES, missing_ok=True)


def test_a_seeds_run_resumed_with_another_seed_axis_is_refused(tmp_path):
  """--vmap_seeds resumed with --seed_axis=map after vmap went on silently and unrecorded
  (the seeds' numbers differ by rounding between the two)."""
  import json  # noqa: PLC0415
  from grpo_jax.train.run import workdir as workdir_lib  # noqa: PLC0415
  config, wd, old = _configs((0,))[0], str(tmp_path / "run"), str(tmp_path / "old")
  for folder, axis in ((wd, "vmap"), (old, None)):  # old: a record from before the field
    workdir_lib.write_config(config, folder)
    workdir_lib.resume_records([folder], [config], None, [{}], DEVICES, "rl", seed_axis=axis)
  starts = json.loads((tmp_path / "run" / "run_info.json").read_text())["starts"]
  assert starts[-1]["seed_axis"] == "vmap"
  assert "seed_axis" not in json.loads((tmp_path / "old" / "run_info.json").read_text())[
      "starts"][-1]
  resume = lambda c, folder, axis: workdir_lib.open_records(  # noqa: E731
      [c], [folder], True, DEVICES, log=lambda *a: None, stage="rl", seed_axis=axis)
  assert resume(config, wd, "vmap") == [{}] and resume(config, old, "map") == [{}]
  with pytest.raises(ConfigError) as err:
    resume(config, wd, "map")
  assert str(err.value) == (
      f"resuming {wd}: --seed_axis=map differs from the --seed_axis=vmap its seeds ran with "
      f"(run_info.json), so the steps to come would differ by rounding from a run that went "
      f"on; run with --seed_axis=vmap, pass another --workdir, or pass "
      f"--config.train.allow_config_change=True to resume anyway (recorded in run_info.json).")
  config.train.allow_config_change = True
  assert resume(config, wd, "map") == [{"seed_axis": ["vmap", "map"],
                                        "train.allow_config_change": [False, True]}]
