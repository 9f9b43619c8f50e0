"""launch/sweep.py's checks before any job (grpo_jax/sweep/spec.py, grpo_jax/sweep/checks.py):
sweep files that raise or give bad seeds, grid values that would escape the sweep folder or
share one, and arms whose config its process would refuse, each one sentence (by direct calls;
the last through launch/sweep.py's main, in this process)."""

import os

import pytest

from grpo_jax.sweep.checks import check_arms
from grpo_jax.sweep.runner import pending_jobs
from grpo_jax.sweep.spec import SweepError, folder_name, load_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep_file(tmp_path, body: str):
  path = tmp_path / "my_sweep.py"
  path.write_text(body)
  return str(path)


def _fields(tmp_path, **fields):
  return _sweep_file(tmp_path, f"def get_sweep():\n  return {fields!r}\n")


@pytest.mark.parametrize("body, message", [
    ("def get_sweep():\n  raise RuntimeError('my sweep needs SWEEP_ROOT')\n",  # P01
     r"get_sweep\(\) raised RuntimeError: my sweep needs SWEEP_ROOT; fix that file"),
    ("import nowhere_to_be_found\n", r"could not be loaded \(ModuleNotFoundError: .*\); fix"),
    ("def get_sweep():\n  return [1]\n", r"get_sweep\(\) returned a list; return a dict"),
    ("get_sweep = 3\n", r"has no get_sweep\(\) function"),
    ("def get_sweep():\n  return {'base_config': 'c.py', 'grid': [1]}\n",
     r"grid=\[1\]; give a dict"),
])
def test_bad_sweep_files_are_one_sentence(tmp_path, body, message):
  with pytest.raises(SweepError, match=message):
    load_sweep(_sweep_file(tmp_path, body))


@pytest.mark.parametrize("seeds", [["zero", "one"], 3, [], [0, 0], [True], [-1], [2**32]])
def test_bad_seeds_are_one_sentence(tmp_path, seeds):  # P02, P03
  with pytest.raises(SweepError, match=r"seeds=.*; give a list of distinct whole numbers in "
                                       r"\[0, 4294967295\], e.g. \[0, 1, 2\]\."):
    load_sweep(_fields(tmp_path, base_config="c.py", seeds=seeds))


def test_arm_folders_stay_inside_the_sweep_folder(tmp_path):  # P04
  escape = "../../../../tmp/escaped"
  sweep = load_sweep(_fields(tmp_path, base_config="c.py",
                             grid={"model.path": [escape, "..", "a\\b%2F", "x\ny", "plain-1e-06"]},
                             seeds=[0]))
  out = str(tmp_path / "out")
  jobs, _ = pending_jobs(sweep, out)
  assert [a.name for a in sweep.arms][0] == f"path={escape}"  # the table keeps the value
  assert [a.directory for a in sweep.arms] == [
      "path=%2E%2E%2F%2E%2E%2F%2E%2E%2F%2E%2E%2Ftmp%2Fescaped", "path=%2E%2E", "path=a%5Cb%252F",
      "path=x%0Ay", "path=plain-1e-06"]  # a plain name is its own folder, as before
  for job in jobs:
    assert os.path.dirname(os.path.dirname(os.path.normpath(job.workdir))) == out
  long = folder_name("path=" + "x" * 400)
  assert len(long.encode()) <= 200 and long != folder_name("path=" + "x" * 401)


def test_values_that_print_alike_are_refused(tmp_path):  # P05
  with pytest.raises(SweepError, match=r"the grid values \{'optim.learning_rate': 0.001\} and "
                                       r"\{'optim.learning_rate': 0.001\} both name the arm "
                                       r"'learning_rate=0.001' .*; drop one of them"):
    load_sweep(_sweep_file(tmp_path, "def get_sweep():\n  return {'base_config': 'c.py', "
                                     "'grid': {'optim.learning_rate': [0.001, 1e-3]}}\n"))
  with pytest.raises(SweepError, match="both name the arm 'flag=true'"):
    load_sweep(_fields(tmp_path, base_config="c.py", grid={"a.flag": [True, "true"]}))


@pytest.mark.parametrize("fields, message", [  # P06
    (dict(grid={"rl.nope": [1, 2]}),
     r"arm 'nope=1': rl.nope is not a config field \(rl has no field 'nope'\); fix its grid "
     r"value in the sweep file\."),
    (dict(overrides={"rl.advantge": "rloo"}),
     r"arm 'base': rl.advantge is not a config field .*did you mean rl.advantage\?\); fix "
     r"overrides or arm_overrides"),
    (dict(grid={"rl.advantage": ["grpo", "bogus"]}),
     r"arm 'advantage=bogus': rl.advantage='bogus' is unknown; valid: .*"),
    (dict(grid={"optim.learning_rate": ["abc"]}),
     r"arm 'learning_rate=abc': its flags do not parse \(.*could not convert string to float"),
    (dict(base_config="configs/nope.py"), r"arm 'base': its config configs/nope.py is not a file"),
    (dict(recipes={"x": {"config": "configs/grpo_tiny.py", "program": "grpo_jax.trian"}},
          grid={"recipe": ["x"]}),  # round 5's W05: caught only when its job ran
     r"arm 'recipe=x': its program 'grpo_jax.trian' is not a module Python can run"),
    # the RL stage's own refusals (its experience source's), which validate alone passed
    (dict(grid={"train.experience_source": ["bogus"]}),
     r"arm 'experience_source=bogus': train.experience_source='bogus' is unknown; valid: "
     r"episodes, fused, fused_episodes, host\."),
])
def test_every_arm_is_checked_before_any_job(tmp_path, fields, message):
  sweep = load_sweep(_fields(tmp_path, **{"base_config": "configs/grpo_tiny.py", **fields}))
  with pytest.raises(SweepError, match=message):
    check_arms(sweep, str(tmp_path / "out"), cwd=ROOT)


def test_the_launcher_starts_no_job_for_a_bad_arm(tmp_path, capsys):
  from launch.sweep import main  # noqa: PLC0415
  path = _fields(tmp_path, base_config="configs/grpo_tiny.py", grid={"rl.nope": [1, 2]})
  assert main([f"--sweep={path}", f"--workdir={tmp_path / 'out'}"]) == 2
  assert capsys.readouterr().err == ("error: arm 'nope=1': rl.nope is not a config field (rl "
                                     "has no field 'nope'); fix its grid value in the sweep "
                                     "file.\n")
  assert not (tmp_path / "out").exists()
  good = _fields(tmp_path, base_config="configs/grpo_tiny.py", grid={"rl.kl_coef": [0.0, 0.1]})
  assert main([f"--sweep={good}", f"--workdir={tmp_path / 'out'}", "--print_commands"]) == 0
  assert len(capsys.readouterr().out.splitlines()) == 2


def test_a_workdir_that_cannot_be_written_is_one_sentence(tmp_path, capsys):
  """Round 5's W10 (a read-only workdir: a 13-line traceback after the first line)."""
  from launch.sweep import main  # noqa: PLC0415
  (tmp_path / "a_file").write_text("")
  good = _fields(tmp_path, base_config="configs/grpo_tiny.py", grid={"rl.kl_coef": [0.0]})
  assert main([f"--sweep={good}", f"--workdir={tmp_path / 'a_file' / 'sw'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: the sweep's workdir {tmp_path / 'a_file' / 'sw'} cannot be "
                        f"written (") and err.endswith("); pass a writable --workdir.\n")


def test_arm_overrides_keys_match_whole_parts_of_the_arm_name(tmp_path):
  """A key applied to every arm whose name contained it: "num_minibatches=1" also to
  "num_minibatches=16", "advantage=grpo" also to "advantage=grpo_batch_std"."""
  sweep = load_sweep(_fields(
      tmp_path, base_config="configs/grpo_tiny.py",
      grid={"rl.num_minibatches": [1, 16], "rl.advantage": ["grpo", "grpo_batch_std"]},
      arm_overrides={"num_minibatches=1": {"rl.kl_coef": 0.5},
                     "num_minibatches=16,advantage=grpo": {"rl.kl_coef": 0.25}}))
  assert {a.name: a.overrides.get("rl.kl_coef") for a in sweep.arms} == {
      "num_minibatches=1,advantage=grpo": 0.5,
      "num_minibatches=1,advantage=grpo_batch_std": 0.5,
      "num_minibatches=16,advantage=grpo": 0.25,
      "num_minibatches=16,advantage=grpo_batch_std": None}
  either = load_sweep(_fields(tmp_path, base_config="c.py", grid={"a.x": [1], "a.y": [2, 3]},
                              arm_overrides={"y=3,x=1": {"a.z": 0}}))  # the parts in any order
  assert [("a.z" in a.overrides) for a in either.arms] == [False, True]
  with pytest.raises(SweepError, match=r"arm_overrides key 'advantage=grp' is in no arm's name"):
    load_sweep(_fields(tmp_path, base_config="c.py", grid={"rl.advantage": ["grpo", "rloo"]},
                       arm_overrides={"advantage=grp": {"rl.kl_coef": 0.5}}))


def test_the_launchers_seed_axis_is_checked_like_the_files(tmp_path, capsys):
  """--seed_axis was applied after load_sweep, past its check that a program other than
  grpo_jax.main (the DPO stage) runs one seed per process."""
  from launch.sweep import main  # noqa: PLC0415
  sweep = os.path.join(ROOT, "configs/sweeps/preference_tiny.py")
  assert main([f"--sweep={sweep}", f"--workdir={tmp_path / 'out'}", "--seed_axis=vmap",
               "--print_commands"]) == 2
  assert capsys.readouterr() == ("", f"error: {sweep}: recipe 'dpo' runs grpo_jax.train_dpo, "
                                     f"which takes one seed per process; pass "
                                     f"--seed_axis=none.\n")
  assert not (tmp_path / "out").exists()
