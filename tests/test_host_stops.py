"""Nothing on the host hangs a run or ends it silently: reward functions have a time limit,
SIGTERM during a host wait saves the last completed step within seconds, a remote outage saves
before it stops, user code's sys.exit is an error, and a run says where its files are. The
standalone evaluation (grpo_jax.eval): its folder, its samples file, its devices (config.mesh,
distributed.*) and a vision-language policy."""

import os
import re
import signal
import threading
import time

import numpy as np
import pytest

from grpo_jax.errors import InputError, RemoteOutage, RewardError, RewardTimeout
from grpo_jax.interrupts import HostInterrupted, interruptible
from grpo_jax.registry import UnknownName, import_plugins
from grpo_jax.rewards.functions import RewardFunction, call_reward
from grpo_jax.train.run import faults
from grpo_jax.train.run.runner import Clock, Schedule, run_steps
from grpo_jax.train.run.summary import closing_line, where_line, write_curves
from grpo_jax.train.run.workdir import check_not_a_run


def _reward(fn, timeout_s=0.0):
  return RewardFunction("rf:test", fn, 1.0, timeout_s)


def test_a_reward_function_past_its_time_limit_stops_the_run_naming_it():
  def slow(prompts, completions, **_):
    time.sleep(30)
  started = time.perf_counter()
  with pytest.raises(RewardError, match=r"^reward function 'rf:test' did not return within "
                     r"reward.timeout_s=0.5 s for 2 completions"):
    call_reward(_reward(slow, 0.5), ["p", "q"], ["a", "b"], {})
  assert time.perf_counter() - started < 3


@pytest.mark.parametrize("body,needle", [
    (lambda p, c, **_: (_ for _ in ()).throw(SystemExit(0)), "called sys.exit(0)"),
    (lambda p, c, **_: (_ for _ in ()).throw(KeyboardInterrupt()), "raised KeyboardInterrupt"),
], ids=["sys_exit", "keyboard_interrupt"])
def test_user_code_that_exits_is_an_error_naming_it(body, needle):
  with pytest.raises(RuntimeError, match=re.escape(f"reward function 'rf:test' {needle}")):
    call_reward(_reward(body), ["p"], ["a"], {})


def test_a_reward_function_gets_copies_and_none_is_named():
  def clears(prompts, completions, **columns):
    completions.clear()
    columns["answer"].clear()
    return [1.0]
  completions, answers = ["a"], ["1"]
  assert call_reward(_reward(clears), ["p"], completions, {"answer": answers}).tolist() == [1.0]
  assert completions == ["a"] and answers == ["1"]
  with pytest.raises(ValueError, match="returned None for a completion"):
    call_reward(_reward(lambda p, c, **_: [None]), ["p"], ["a"], {})


def test_sigterm_during_a_slow_reward_interrupts_the_wait_at_once():
  def slow(prompts, completions, **_):
    time.sleep(30)
  timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
  started = time.perf_counter()
  with faults.TerminationFlag() as flag:
    timer.start()
    with pytest.raises(HostInterrupted, match="SIGTERM"):
      call_reward(_reward(slow), ["p"], ["a"], {})
  assert flag.requested and time.perf_counter() - started < 3
  # outside a host wait the signal only sets the flag, as before; a wait that would start
  # after it (round4 F14 at a bad moment: SIGTERM during a compile) stops on entry instead
  with faults.TerminationFlag() as flag:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    assert flag.requested
    started = time.perf_counter()
    with pytest.raises(HostInterrupted, match="SIGTERM"):
      call_reward(_reward(slow), ["p"], ["a"], {})
    assert time.perf_counter() - started < 1
  call_reward(_reward(lambda p, c, **_: [0.0]), ["p"], ["a"], {})  # a new flag forgets it


class _State:
  def __init__(self, step):
    self.step = np.asarray(step)


class _Checkpoints:
  directory = "/w/checkpoints"

  def __init__(self):
    self.saved = []

  def save(self, state):
    self.saved.append(int(state.step))


@pytest.mark.parametrize("stop", ["signal", "outage", "timeout"])
def test_a_stop_in_a_host_wait_saves_the_last_completed_step(stop):
  ckpts, written = _Checkpoints(), []

  def advance(state):
    if int(state.step) == 2:
      if stop == "signal":
        with interruptible():
          raise HostInterrupted(signal.SIGTERM)
      if stop == "timeout":
        raise RewardTimeout("reward function 'm:f' did not return within reward.timeout_s=1 s")
      raise RemoteOutage("the teacher at http://t failed 4 times (HTTP 503)")
    return _State(int(state.step) + 1), [[{}]], [0]

  def write(state, first, records, tokens, seconds, clock):
    written.append(first)

  schedule = Schedule(steps=5, eval_every=10, checkpoint_every=0)
  with faults.TerminationFlag() as flag:
    flag.signal = signal.SIGTERM
    error = {"signal": faults.Preempted, "outage": RemoteOutage, "timeout": RewardTimeout}[stop]
    with pytest.raises(error) as e:
      run_steps(_State(0), advance, lambda s, t: [{}], write, schedule=schedule, ckpts=ckpts,
                sigterm=flag, resumed=False)
  assert ckpts.saved == [2] and written == [0, 1, 2]
  assert "saved checkpoint /w/checkpoints/2" in str(e.value)
  if stop == "signal":
    assert e.value.exit_code == 143
  elif stop == "outage":
    assert str(e.value).startswith("the teacher at http://t failed 4 times")


def test_the_eta_counts_compiled_steps_only():
  assert Clock(70.0, 1, 65.0, compiled=False).eta(100) == (
      "eta after the next step (this one compiled)")
  assert Clock(75.0, 2, 0.5, compiled=True).eta(98) == "eta 0m49s"


def test_the_closing_line_and_the_curves(tmp_path):
  records = [{"step": 0, "eval_accuracy": 0.1}, {"step": 1, "reward_mean": 0.2},
             {"step": 2, "reward_mean": 0.5, "eval_accuracy": 0.75}]
  for name in ("metrics.jsonl", "curves.png", "samples.jsonl"):
    (tmp_path / name).write_text("")
  line = closing_line(str(tmp_path), 2, 125.0, "checkpoints/2", False, records)
  assert line == (f"done: step 2/2 in 2m05s; held-out eval_accuracy 0.100 (step 0) -> 0.750 "
                  f"(step 2); files in {tmp_path}: metrics.jsonl, curves.png, samples.jsonl, "
                  f"checkpoints/2")
  assert write_curves(str(tmp_path), records)
  assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert not write_curves(str(tmp_path / "empty"), [])


def test_curves_that_cannot_be_written_leave_no_figure_and_no_partial_file(tmp_path, monkeypatch,
                                                                           capsys):
  """A full disk at curves.png: the figure stayed open in pyplot and curves.png.partial on disk,
  once more at every evaluation (write_curves keeps the run going)."""
  import matplotlib.pyplot as plt  # noqa: PLC0415
  from matplotlib.figure import Figure  # noqa: PLC0415

  def full_disk(self, f, **kwargs):
    f.write(b"\x89PNG")
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(Figure, "savefig", full_disk)
  before = len(plt.get_fignums())
  for _ in range(3):
    assert not write_curves(str(tmp_path), [{"step": 0, "reward_mean": 0.5}])
  assert len(plt.get_fignums()) == before and list(tmp_path.iterdir()) == []
  assert capsys.readouterr().err.count("warning: curves.png was not drawn (OSError: ") == 3


def test_the_where_line_names_each_stacked_seeds_folder():
  assert where_line("/r", tensorboard=False) == (
      "workdir /r: metrics.jsonl, curves.png and checkpoints/ go there (the same command "
      "resumes it)")
  assert where_line("/r", tensorboard=False, per_seed=("/r/seed_0", "/r/seed_1")) == (
      "workdir /r: each seed's metrics.jsonl, curves.png and checkpoints/ go to its folder "
      "(/r/seed_0, /r/seed_1; the same command resumes them)")


def test_eval_refuses_a_training_runs_workdir(tmp_path):
  check_not_a_run(str(tmp_path))  # an empty folder is fine
  (tmp_path / "metrics.jsonl").write_text("")
  with pytest.raises(InputError, match=r"holds a training run \(metrics.jsonl\); give the "
                     r"evaluation its own folder"):
    check_not_a_run(str(tmp_path))


def _eval(workdir, *overrides, config="grpo_tiny.py") -> int:
  """`python -m grpo_jax.eval --config=configs/<config> --workdir=<workdir> <overrides>` in this
  process: its exit status."""
  from grpo_jax import eval as evaluation  # noqa: PLC0415
  from grpo_jax.main import cli  # noqa: PLC0415
  from tests.tiny_runs import ROOT  # noqa: PLC0415
  return cli([f"--workdir={workdir}", f"--config={ROOT}/configs/{config}", *overrides],
             evaluation.main)


def test_eval_without_samples_writes_the_figures_and_no_samples_file(tmp_path, capfd):
  """`python -m grpo_jax.eval ... --config.train.num_samples=0` raised IndexError after
  eval.json was written; without samples it writes no samples.jsonl and prints none, and an
  earlier evaluation's samples.jsonl in the folder goes (it was left beside the new figures)."""
  (tmp_path / "samples.jsonl").write_text('{"step": 0, "prompt": "an earlier evaluation"}\n')
  code = _eval(tmp_path, "--config.train.num_samples=0", "--config.train.eval_size=4",
               "--config.train.eval_batch_size=4")
  out, err = capfd.readouterr()
  assert code == 0, err
  assert sorted(os.listdir(tmp_path)) == ["eval.json"] and "eval_accuracy: " in out
  assert "[eval]" not in out


@pytest.mark.parametrize("overrides,needle", [
    (("--config.mesh.data=3", "--config.mesh.tensor=7"),
     r"^error: mesh \(data, fsdp, tensor, expert, context\) = \(3, 1, 7, 1, 1\) has 21 devices "
     r"but 1 are present; make the product 1 \(or set one axis to -1\)\.$"),
    (("--config.distributed.mode=explicit",),
     r"^error: distributed.mode='explicit' needs a coordinator address"),
])
def test_eval_starts_the_devices_as_training_does(tmp_path, capfd, monkeypatch, overrides,
                                                  needle):
  """grpo_jax.eval ignored config.mesh and config.distributed: a mesh the training refuses
  (21 devices asked, 1 present) was evaluated on one device and exited 0. Now the mesh and the
  multi-host start-up are the RL stage's: refused in one sentence before any compute."""
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  code = _eval(tmp_path / "eval", *overrides)
  _, err = capfd.readouterr()
  assert code == 2 and re.search(needle, err.strip()), err
  assert not (tmp_path / "eval").exists()


def test_eval_of_a_vision_language_policy(tmp_path, capfd):
  """grpo_jax.eval built the model without the task, so configs/grpo_vision_tiny.py (task.name=
  'visual') stopped at "model.vision is set but the task has no images"; the images now reach
  the model, as in the RL stage."""
  code = _eval(tmp_path, "--config.train.eval_size=2", "--config.train.eval_batch_size=2",
               "--config.train.num_samples=1", config="grpo_vision_tiny.py")
  out, err = capfd.readouterr()
  assert code == 0, err
  assert sorted(os.listdir(tmp_path)) == ["eval.json", "samples.jsonl"]
  assert "eval_accuracy: " in out and "[eval] '<image> Which bar is taller" in out


def test_an_imports_file_that_exits_is_one_sentence(tmp_path):
  path = tmp_path / "exits0.py"
  path.write_text("import sys\nsys.exit(0)\n")
  with pytest.raises(UnknownName, match=r"raised SystemExit: 0 while being imported"):
    import_plugins(str(path))


def test_an_imports_file_that_raises_after_registering_leaves_nothing_registered(tmp_path):
  """Its entries go with it (the fixed file, imported again in the same process, registers the
  same names instead of finding them taken); those of a module it imported that succeeded stay,
  as that module stays imported."""
  import sys  # noqa: PLC0415

  from grpo_jax.rl.estimators import ESTIMATORS  # noqa: PLC0415
  from grpo_jax.rl.kl import KL_ESTIMATORS  # noqa: PLC0415
  (tmp_path / "helper_kept_adv.py").write_text(
      "from grpo_jax.rl.estimators import ESTIMATORS\n"
      "ESTIMATORS.register('kept_adv', lambda inputs: inputs)\n")
  path = tmp_path / "half.py"
  body = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport helper_kept_adv\n"
          "from grpo_jax.rl.estimators import ESTIMATORS\n"
          "from grpo_jax.rl.kl import KL_ESTIMATORS\n"
          "ESTIMATORS.register('half_adv', lambda inputs: inputs)\n"
          "KL_ESTIMATORS.register('half_kl', lambda logp, ref: logp - ref)\n")
  path.write_text(body + "raise RuntimeError('a typo further down')\n")
  before = (ESTIMATORS.names(), KL_ESTIMATORS.names())
  try:
    with pytest.raises(UnknownName, match=r"raised RuntimeError: a typo further down while"):
      import_plugins(str(path))
    assert ESTIMATORS.names() == tuple(sorted((*before[0], "kept_adv")))
    assert KL_ESTIMATORS.names() == before[1]
    path.write_text(body)
    assert import_plugins(str(path), log=lambda _: None) == [str(path)]
    assert "half_adv" in ESTIMATORS and "half_kl" in KL_ESTIMATORS
  finally:
    for name in ("half_adv", "kept_adv"):
      ESTIMATORS.unregister(name)
    KL_ESTIMATORS.unregister("half_kl")
    sys.modules.pop("helper_kept_adv", None)
    while str(tmp_path) in sys.path:
      sys.path.remove(str(tmp_path))


def test_a_short_csv_row_is_a_bad_row(tmp_path):
  from grpo_jax.data.table import BadRow, _file_rows  # noqa: PLC0415
  path = tmp_path / "rows.csv"
  path.write_text('prompt,answer\nWhat is 1+1?,2\nonly_one_field\n"a,b",3,4\n')
  rows = list(_file_rows(str(path)))
  assert rows[0][1] == {"prompt": "What is 1+1?", "answer": "2"}
  assert [str(r) for _, r in rows[1:]] == [
      "has 1 fields where the header names 2; give every row the header's fields",
      "has 3 fields where the header names 2; give every row the header's fields"]
  assert all(isinstance(r, BadRow) for _, r in rows[1:])


def test_a_full_disk_at_the_export_is_one_sentence(tmp_path, monkeypatch):
  """round4 K07: the export's write fails: one RunStopped sentence, no half-written folder."""
  import types  # noqa: PLC0415

  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.errors import RunStopped  # noqa: PLC0415
  from grpo_jax.models import hf_export  # noqa: PLC0415
  from grpo_jax.train.run.export import export_policy  # noqa: PLC0415
  from grpo_jax.train.run.sections import ModelSection  # noqa: PLC0415
  from tests.fixtures import tiny_model_config  # noqa: PLC0415

  def full_disk(params, model_cfg, folder, **_):
    os.makedirs(folder, exist_ok=True)
    (open(os.path.join(folder, "model.safetensors"), "w")).close()
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(hf_export, "export_hf_checkpoint", full_disk)
  config = get_defaults()
  config.train.export = True
  state = types.SimpleNamespace(params={"w": np.zeros(2)}, base_params=None)
  with pytest.raises(RunStopped, match=r"^writing the export .*hf_export failed \(OSError: "
                     r"\[Errno 28\] No space left on device\); the run's checkpoints are intact"):
    export_policy(ModelSection.of(config), state, tiny_model_config(), str(tmp_path), print)
  assert not (tmp_path / "hf_export").exists()


def test_print_config_lists_every_field_with_its_doc(capsys):
  from grpo_jax.main import cli  # noqa: PLC0415
  code = cli(["--config=configs/grpo_tiny.py", "--config.train.steps=7", "--print_config"])
  out = capsys.readouterr().out.splitlines()
  assert code == 0 and out[0] == "[top level]"
  steps = next(line for line in out if line.startswith("train.steps = 7"))
  assert steps.split("  # ")[1].startswith("RL steps")
  assert any(line.startswith("reward.timeout_s = 300.0 ") and "seconds" in line for line in out)
  assert not any(line.startswith("# a run of this config would stop") for line in out)
  # round 5's X02: a value the run refuses is printed, and said to be refused
  code = cli(["--config=configs/grpo_tiny.py", "--config.rl.kl_coef=-1", "--print_config"])
  out = capsys.readouterr().out.splitlines()
  assert code == 0 and out[-1] == ("# a run of this config would stop at once: rl.kl_coef=-1.0; "
                                   "use a finite value >= 0 (0 turns KL off).")
  # and what the RL stage refuses beyond validate: its experience source
  code = cli(["--config=configs/grpo_tiny.py", "--config.train.experience_source=x",
              "--print_config"])
  out = capsys.readouterr().out.splitlines()
  assert code == 0 and out[-1].startswith("# a run of this config would stop at once: "
                                          "train.experience_source='x' is unknown")


def test_a_config_file_that_exits_is_one_sentence(tmp_path, capfd):
  from grpo_jax.main import cli  # noqa: PLC0415
  path = tmp_path / "exits0.py"
  path.write_text("import sys\nsys.exit(0)\ndef get_config():\n  pass\n")
  code = cli([f"--config={path}", f"--workdir={tmp_path / 'w'}"])
  err = capfd.readouterr().err
  assert code == 2 and err.strip() == (f"error: --config={path} could not be loaded "
                                               f"(SystemExit: 0); fix that file.")


def test_a_run_says_when_it_has_no_signal():
  """Issue 76: one line at the K-th step in a row with every group tied, naming the remedies'
  fields; the warm-up check's line when no sample of the first batch earns a reward; the
  closing line counts the steps without signal."""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.train.run.no_signal import NoSignalWatch, warmup_check_line  # noqa: PLC0415
  config, lines = grpo_calculator_tiny.get_config(), []
  watch = NoSignalWatch(3, config, lines.append)
  tied = {"frac_groups_all_same": 1.0, "reward_mean": 0.0, "reward_std": 0.0}
  for step, record in enumerate([tied, {"frac_groups_all_same": 0.5}, tied, tied, tied, tied],
                                start=1):
    watch.see(step, record)
  assert len(lines) == 1 and lines[0].startswith(
      "no signal: steps 3-5, every group tied (at reward 0.000), so no update moved the policy "
      "(rl.skip_without_signal).")
  for field in ("rl.dynamic_sampling=True", f"rollout.group_size (now {config.rollout.group_size})",
                f"rollout.temperature (now {config.rollout.temperature:g})",
                f"warmup.steps, now {config.warmup.steps}"):
    assert field in lines[0]
  none = warmup_check_line([0.0] * 16, 8, config)
  assert none.startswith("warm-up check: the first batch's 16 samples (2 prompts x 8), scored "
                         "as the RL step scores them: none earns a reward")
  some = warmup_check_line([1.0] + [0.0] * 15, 8, config)
  assert "1 of 16 earn a reward (success rate 0.062" in some and "50% of the groups tied" in some
  # With a KL term in the loss a tied step's gradient is not 0 and its update is applied: the
  # line said "no update moved the policy" all the same.
  kl = config.copy_and_resolve_references()
  kl.rl.update(kl_coef=0.02, kl_in="loss")
  lines.clear()
  watch = NoSignalWatch(1, kl, lines.append)
  watch.see(1, tied)
  assert "so only the loss's terms without advantages (the KL, entropy, value or distillation " \
         "term) moved the policy." in lines[0] and "no update moved" not in lines[0]
  records = [{"step": 0, "eval_accuracy": 0.0}] + [
      {"step": s, "reward_mean": 0.0, "frac_groups_all_same": 1.0 if s > 1 else 0.5}
      for s in (1, 2, 3)]
  assert closing_line("/r", 3, None, None, False, records).startswith(
      "done: step 3/3; held-out eval_accuracy 0.000 (step 0) -> 0.000 (step 0); 2 of 3 steps "
      "without signal (every group tied); files in /r")
