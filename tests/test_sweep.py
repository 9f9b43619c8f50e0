"""Sweeps: the sweep file, the report's numbers against NumPy, and launch/sweep.py end to end
(runs, skipping finished runs, printing commands)."""

import csv
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from grpo_jax.sweep.report import write_report
from grpo_jax.sweep.runner import pending_jobs
from grpo_jax.sweep.spec import SweepError, load_sweep
from tests.tiny_runs import cache_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep_file(tmp_path, **fields):
  path = tmp_path / "my_sweep.py"
  path.write_text(f"def get_sweep():\n  return {fields!r}\n")
  return str(path)


def test_sweep_file_gives_arms_overrides_and_commands(tmp_path):
  path = _sweep_file(tmp_path, base_config="configs/grpo_tiny.py",
                     overrides={"train.steps": 7},
                     grid={"rl.advantage": ["grpo", "gae"], "rl.kl_coef": [0.0, 0.02]},
                     arm_overrides={"advantage=gae": {"rl.value_head": "shared"}},
                     seeds=[3, 4], seed_axis="none")
  sweep = load_sweep(path)
  assert sweep.name == "my_sweep"
  assert [a.name for a in sweep.arms] == ["advantage=grpo,kl_coef=0.0",
                                          "advantage=grpo,kl_coef=0.02",
                                          "advantage=gae,kl_coef=0.0",
                                          "advantage=gae,kl_coef=0.02"]
  assert sweep.arms[2].overrides == {"train.steps": 7, "rl.advantage": "gae",
                                     "rl.kl_coef": 0.0, "rl.value_head": "shared"}
  assert "rl.value_head" not in sweep.arms[0].overrides
  jobs, skipped = pending_jobs(sweep, str(tmp_path / "out"))
  assert skipped == 0 and len(jobs) == 8  # one process per (arm, seed)
  assert jobs[3].command[:3] == ("python", "-m", "grpo_jax.main")
  assert "--config.seed=4" in jobs[3].command and "--config.rl.kl_coef=0.02" in jobs[3].command
  assert jobs[3].workdir == str(tmp_path / "out" / "advantage=grpo,kl_coef=0.02" / "seed_4")
  vmapped = load_sweep(_sweep_file(tmp_path, base_config="c.py", grid={"a.b": [1, 2]},
                                   seeds=[0, 1, 2], seed_axis="vmap"))
  jobs, _ = pending_jobs(vmapped, str(tmp_path / "v"))
  assert len(jobs) == 2 and "--vmap_seeds=0,1,2" in jobs[0].command
  # round 5's W03: a key that matches no arm (a typo) is refused, not dropped
  with pytest.raises(SweepError, match=r"arm_overrides key 'advantage=rlo0' is in no arm's "
                     r"name, so its overrides would never apply; the arms are advantage=grpo, "):
    load_sweep(_sweep_file(tmp_path, base_config="c.py", grid={"rl.advantage": ["grpo", "rloo"]},
                           arm_overrides={"advantage=rlo0": {"rl.kl_coef": 0.5}}))


def test_recipes_pick_each_arms_config_and_program(tmp_path):
  """The grid key "recipe" selects a named config and program per arm (not a --config flag)."""
  sweep = load_sweep(_sweep_file(
      tmp_path, base_config="configs/grpo_tiny.py", overrides={"train.steps": 5},
      recipes={"grpo": {"config": "configs/grpo_tiny.py"},
               "dpo": {"config": "configs/dpo_tiny.py", "program": "grpo_jax.train_dpo"}},
      grid={"recipe": ["grpo", "dpo"]}, seeds=[0]))
  jobs, _ = pending_jobs(sweep, str(tmp_path / "out"))
  assert [j.command[:4] for j in jobs] == [
      ("python", "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py"),
      ("python", "-m", "grpo_jax.train_dpo", "--config=configs/dpo_tiny.py")]
  assert all(not any(c.startswith("--config.recipe") for c in j.command) for j in jobs)
  assert "--config.train.steps=5" in jobs[1].command
  for bad, words in ((dict(recipes={}), "recipes does not define"),
                     (dict(seed_axis="vmap"), "seed_axis='none'"),
                     (dict(recipes={"dpo": {"config": "d.py", "programme": "x"}}),
                      r"recipes\['dpo'\] has unknown key\(s\) \['programme'\]"),
                     (dict(recipes={"dpo": {"config": None}}), r"config=None is not a non-empty"),
                     (dict(recipes={"dpo": {"config": "d.py", "program": 5}}), r"program=5 is"),
                     (dict(recipes={"dpo": "d.py"}), r"recipes\['dpo'\] is 'd.py', not a dict")):
    fields = dict(base_config="c.py", grid={"recipe": ["dpo"]},
                  recipes={"dpo": {"config": "d.py", "program": "grpo_jax.train_dpo"}})
    with pytest.raises(SweepError, match=words):
      load_sweep(_sweep_file(tmp_path, **{**fields, **bad}))


@pytest.mark.parametrize("fields,message", [
    (dict(grid={}), "must name base_config"),
    (dict(base_config="c.py", grids={}), "unknown sweep field"),
    (dict(base_config="c.py", seeds=[1, 1]), "distinct whole numbers"),
    (dict(base_config="c.py", seed_axis="pmap"), "seed_axis='pmap' is unknown"),
    (dict(base_config="c.py", grid={"rl.advantage": []}), "non-empty list"),
    # a "seed" outside seeds=[...] came after each run's --config.seed and won (one run, std 0)
    (dict(base_config="c.py", overrides={"seed": 7}, seeds=[0, 1]),
     r"my_sweep.py: overrides sets 'seed', which would make every seed of the sweep the same run; "
     r"give the seeds as seeds=\[...\] alone."),
    (dict(base_config="c.py", grid={"seed": [1, 2]}), r"grid sets 'seed'"),
    (dict(base_config="c.py", grid={"rl.advantage": ["grpo", "rloo"]},
          arm_overrides={"rloo": {"seed": 3}}), r"arm_overrides\['rloo'\] sets 'seed'"),
])
def test_bad_sweep_files_are_named(tmp_path, fields, message):
  with pytest.raises(SweepError, match=message):
    load_sweep(_sweep_file(tmp_path, **fields))


def _fake_run(directory, rewards, kls, evals, wall):
  os.makedirs(directory)
  with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 0, "eval_accuracy": evals[0]}) + "\n")
    for step, (r, k) in enumerate(zip(rewards, kls), start=1):
      record = {"step": step, "reward_mean": r, "kl": k}
      if step == len(rewards):
        record["eval_accuracy"] = evals[1]
      f.write(json.dumps(record) + "\n")
  with open(os.path.join(directory, "DONE.json"), "w") as f:
    json.dump({"wall_s": wall}, f)


def test_report_numbers_equal_numpy(tmp_path):
  sweep = load_sweep(_sweep_file(tmp_path, base_config="c.py", grid={"rl.advantage": ["x", "y"]},
                                 seeds=[0, 1, 2]))
  rng = np.random.default_rng(0)
  truth = {}
  for arm in ("advantage=x", "advantage=y"):
    for seed in (0, 1, 2):
      rewards, kls = rng.random(40), rng.random(40) * 0.01
      evals, wall = rng.random(2), float(rng.integers(50, 100))
      _fake_run(tmp_path / "out" / arm / f"seed_{seed}", rewards.tolist(), kls.tolist(),
                evals.tolist(), wall)
      # Last 10% of 40 steps = the last 4.
      truth.setdefault(arm, []).append((rewards[-4:].mean(), evals[1], kls[-4:].mean(), wall))
  # A seed without DONE.json (unfinished) is left out.
  os.makedirs(tmp_path / "out" / "advantage=y" / "seed_9")
  written = write_report(sweep, str(tmp_path / "out"))
  names = sorted(os.path.basename(p) for p in written)
  assert names == ["eval_accuracy.png", "results.csv", "results.md", "reward_mean.png",
                   "runs.csv"]
  for p in written:
    if p.endswith(".png"):  # a real image: PNG signature, and more than an empty canvas
      with open(p, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
      assert os.path.getsize(p) > 10_000
  with open(tmp_path / "out" / "results.csv") as f:
    rows = {row["arm"]: row for row in csv.DictReader(f)}
  for arm, values in truth.items():
    values = np.asarray(values)
    row = rows[arm]
    assert row["seeds"] == "3"
    for column, figure in enumerate(("final_reward", "eval_accuracy", "kl", "wall_s")):
      np.testing.assert_allclose(float(row[f"{figure}_mean"]), values[:, column].mean(),
                                 rtol=1e-12)
      np.testing.assert_allclose(float(row[f"{figure}_std"]), values[:, column].std(ddof=1),
                                 rtol=1e-12)
  table = (tmp_path / "out" / "results.md").read_text()
  mean, std = np.asarray(truth["advantage=x"])[:, 0].mean(), np.asarray(
      truth["advantage=x"])[:, 0].std(ddof=1)
  assert f"| advantage=x | 3 | {mean:.3f} ± {std:.3f} |" in table


def _sweep_cli(*args, env=None):
  return subprocess.run([sys.executable, "launch/sweep.py", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
def test_sweep_runs_reports_and_skips_finished_runs(tmp_path):
  small = {"warmup.steps": 5, "warmup.batch_size": 32, "train.steps": 2,
           "train.eval_every": 2, "train.eval_size": 20, "train.eval_batch_size": 10,
           "rollout.num_prompts": 4, "rollout.group_size": 4}
  path = _sweep_file(tmp_path, base_config="configs/grpo_tiny.py", overrides=small,
                     grid={"rl.advantage": ["grpo", "rloo"]}, seeds=[0, 1], seed_axis="vmap")
  out = tmp_path / "out"
  env = cache_env(tmp_path / "jax_cache")  # the third call reruns a program of the first
  first = _sweep_cli(f"--sweep={path}", f"--workdir={out}", "--parallel=2", env=env)
  assert first.returncode == 0, first.stdout + first.stderr
  assert "0 finished run(s) skipped, 4 to run in 2 process(es)" in first.stdout
  for arm in ("advantage=grpo", "advantage=rloo"):
    for seed in (0, 1):
      records = [json.loads(line) for line in
                 (out / arm / f"seed_{seed}" / "metrics.jsonl").read_text().splitlines()]
      assert [r["step"] for r in records] == [0, 1, 2]
  with open(out / "runs.csv") as f:
    runs = list(csv.DictReader(f))
  assert len(runs) == 4
  # The report's final reward of a run is its mean reward over the last 10% (= last) step.
  last = json.loads((out / "advantage=rloo" / "seed_1" / "metrics.jsonl").read_text()
                    .splitlines()[-1])
  row = next(r for r in runs if r["arm"] == "advantage=rloo" and r["seed"] == "1")
  assert float(row["final_reward"]) == pytest.approx(last["reward_mean"], abs=1e-12)
  assert float(row["eval_accuracy"]) == pytest.approx(last["eval_accuracy"], abs=1e-12)
  stamp = os.path.getmtime(out / "advantage=grpo" / "seed_0" / "DONE.json")

  # Run again: everything is skipped; with one run undone only that one is run.
  again = _sweep_cli(f"--sweep={path}", f"--workdir={out}")
  assert again.returncode == 0, again.stderr
  assert "4 finished run(s) skipped, 0 to run in 0 process(es)" in again.stdout
  os.remove(out / "advantage=rloo" / "seed_1" / "DONE.json")
  printed = _sweep_cli(f"--sweep={path}", f"--workdir={out}", "--print_commands")
  assert printed.stdout.splitlines() == [
      f"python -m grpo_jax.main --config=configs/grpo_tiny.py "
      f"--workdir={out / 'advantage=rloo'} --vmap_seeds=1 --seed_axis=vmap "
      + " ".join(f"--config.{k}={v}" for k, v in small.items()) + " --config.rl.advantage=rloo"]
  third = _sweep_cli(f"--sweep={path}", f"--workdir={out}", env=env)
  assert "3 finished run(s) skipped, 1 to run in 1 process(es)" in third.stdout, third.stdout
  assert os.path.getmtime(out / "advantage=grpo" / "seed_0" / "DONE.json") == stamp
  redone = [json.loads(line) for line in
            (out / "advantage=rloo" / "seed_1" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in redone] == [0, 1, 2]  # started afresh, records not duplicated
  assert (out / "advantage=rloo" / "seed_1" / "DONE.json").exists()


def test_points_against_wall_clock_take_each_steps_elapsed_seconds():
  """eval_accuracy_wall.png's x: the elapsed_s of the step an evaluation followed (0 at step
  0); none when a step has no elapsed_s (then no plot)."""
  from grpo_jax.sweep.report import points  # noqa: PLC0415
  records = [{"step": 0, "eval_accuracy": 0.2}, {"step": 1, "reward_mean": 0.1, "elapsed_s": 3.0},
             {"step": 2, "reward_mean": 0.3, "elapsed_s": 5.5},
             {"step": 2, "eval_accuracy": 0.6}]
  assert points(records, "eval_accuracy") == [(0, 0.2), (2, 0.6)]
  assert points(records, "eval_accuracy", "elapsed_s") == [(0.0, 0.2), (5.5, 0.6)]
  assert points(records, "reward_mean", "elapsed_s") == [(3.0, 0.1), (5.5, 0.3)]
  assert points([{"step": 4, "eval_accuracy": 0.5}], "eval_accuracy", "elapsed_s") == []


def test_sigterm_to_the_launcher_stops_its_jobs_and_a_rerun_sums_their_time(tmp_path):
  """Round 5's W08 and W09: SIGTERM to the launcher reaches its running job (which saves and
  exits) instead of leaving it orphaned; the job's seconds are kept, and the process that
  finishes it reports both processes' time, not its own."""
  import signal  # noqa: PLC0415
  job_program = ("import signal, sys, time\n"
                 "def saved(*_):\n  open('saved', 'w').write('1')\n  sys.exit(143)\n"
                 "signal.signal(signal.SIGTERM, saved)\nopen('started', 'w').write('1')\n"
                 "time.sleep(60)\n")
  launcher = (f"import sys\nsys.path.insert(0, {ROOT!r})\n"
              "from grpo_jax.sweep.runner import SweepStopped, run_jobs\n"
              "from grpo_jax.sweep.spec import Arm, Job\n"
              f"job = Job(Arm('a', {{}}, {{}}), (0,), {str(tmp_path / 'job')!r}, "
              f"('python', '-c', {job_program!r}))\n"
              "try:\n  run_jobs([job], '.', cwd=job.workdir)\n"
              "except SweepStopped as e:\n  sys.exit(128 + e.signum)\n")
  (tmp_path / "job").mkdir()
  process = subprocess.Popen([sys.executable, "-c", launcher], cwd=tmp_path)
  for _ in range(300):
    if (tmp_path / "job" / "started").exists():
      break
    time.sleep(0.1)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=60) == 143
  assert (tmp_path / "job" / "saved").exists()  # the job got the signal and saved
  (first,) = json.loads((tmp_path / "job" / "sweep_wall_s.json").read_text())
  from grpo_jax.sweep.runner import _add_wall  # noqa: PLC0415
  from grpo_jax.sweep.spec import Arm, Job  # noqa: PLC0415
  job = Job(Arm("a", {}, {}), (0,), str(tmp_path / "job"), ("python",))
  assert _add_wall(job, 2.0) == pytest.approx(first + 2.0)


def test_a_damaged_metrics_line_is_left_out_and_a_damaged_done_file_is_one_sentence(tmp_path):
  """The report read metrics.jsonl and DONE.json with bare json.loads: a line a kill cut short
  (which the run's own reader leaves out) or a damaged DONE.json ended in a traceback."""
  sweep_file = _sweep_file(tmp_path, base_config="c.py", grid={"rl.advantage": ["x"]}, seeds=[0])
  run = tmp_path / "out" / "advantage=x" / "seed_0"
  _fake_run(run, [0.25, 0.75], [0.5, 0.5], [0.0, 1.0], 7.0)
  with open(run / "metrics.jsonl", "a") as f:
    f.write('{"step": 3, "reward_m')
  write_report(load_sweep(sweep_file), str(tmp_path / "out"))
  with open(tmp_path / "out" / "runs.csv") as f:
    row = next(csv.DictReader(f))
  assert (float(row["final_reward"]), int(row["steps"]), float(row["wall_s"])) == (0.75, 2, 7.0)
  (run / "DONE.json").write_text('{"wall_s": ')
  out = _sweep_cli(f"--sweep={sweep_file}", f"--workdir={tmp_path / 'out'}", "--report_only")
  assert out.returncode == 2 and out.stderr == (
      f"error: {run}/DONE.json is damaged (JSONDecodeError: Expecting value: line 1 column 12 "
      f"(char 11)); delete it to run that seed again (its checkpoints resume it), or restore "
      f"it.\n"), out.stderr
