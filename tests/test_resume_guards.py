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
