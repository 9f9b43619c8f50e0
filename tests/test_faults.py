"""Faults that stop a run with one sentence, before they can spoil a record: a reward of the
wrong shape or too many failed rewards, an update whose result is not finite, a second run on
a locked workdir."""

import dataclasses
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.data.arithmetic import AdditionTask
from grpo_jax.rewards import guard
from grpo_jax.train.run import faults
from grpo_jax.train.learner import update as update_lib
from grpo_jax.train.learner.state import make_optimizer
from tests.tiny_runs import ROOT, command as _command


class _Shaped:
  """The addition task whose reward returns `value(rewards)` instead of its rewards."""

  def __init__(self, task, value):
    self.task, self.value = task, value

  def __getattr__(self, name):
    return getattr(self.task, name)

  def score(self, batch, tokens, mask, group_size):
    return self.value(self.task.score(batch, tokens, mask, group_size))


@pytest.mark.parametrize("mode", ["raise", "zero"])
@pytest.mark.parametrize("value, got", [
    (lambda r: None, "None"), (lambda r: r[:-1], "values of shape (5,)"),
    (lambda r: r.reshape(2, 3), "values of shape (2, 3)"),
    (lambda r: ["x"] * len(r), "values that are not numbers")])
def test_a_reward_of_the_wrong_shape_names_the_function(mode, value, got):
  """A wrong shape or None is a bug of the reward function, in either mode: one sentence naming
  the function and the shape it must return, not an error blamed on one completion."""
  task = AdditionTask(2, 100, 4, fixed_width=True, reverse_answer=True)
  prompts = task.encode(np.array([[7, 68], [12, 30]]))
  tokens = np.full((6, 4), 5, np.int32)
  mask = np.ones((6, 4), bool)
  with pytest.raises(faults.RewardError) as err:
    guard.guarded_score(_Shaped(task, value), prompts, tokens, mask, 3, mode)
  assert str(err.value) == (f"the reward function 'exact_match' returned {got} for 6 "
                            f"completions; it must return one finite number per completion, "
                            f"shape (6,).")


class _NanOnEmpty:
  """The addition task whose held-out scoring returns NaN for an empty completion."""

  def __init__(self, task):
    self.task = task

  def __getattr__(self, name):
    return getattr(self.task, name)

  def eval_scores(self, batch, tokens, mask):
    scores = self.task.eval_scores(batch, tokens, mask)
    empty = ~np.asarray(mask).any(1)
    return {k: np.where(empty, np.nan, v) for k, v in scores.items()}


@pytest.mark.parametrize("mode", ["raise", "zero"])
def test_evaluation_scores_take_the_training_rewards_error_policy(mode):
  """A held-out score that is not finite: one sentence showing the prompt and completion, or
  (train.on_reward_error='zero') scored 0 and counted in eval_reward_errors; never a NaN in the
  figures (they used to print 'eval_acc nan' and exit 0)."""
  from grpo_jax.train.run.evaluation import evaluate_models  # noqa: PLC0415
  task = AdditionTask(2, 100, 4, fixed_width=True, reverse_answer=True)
  batch = task.test_batch(4)
  right = batch.target_tokens.copy()  # the right answers, one of them emptied
  mask = batch.target_mask.copy()
  mask[2] = False
  rollout = types.SimpleNamespace(completion_tokens=right[None], completion_mask=mask[None])
  train_cfg = types.SimpleNamespace(eval_size=4, eval_batch_size=4, eval_pass_k=0,
                                    num_samples=0, on_reward_error=mode, prompt_bucket=0)
  generate = lambda *_: rollout  # noqa: E731
  if mode == "raise":
    with pytest.raises(faults.RewardError) as err:
      evaluate_models(generate, 1, _NanOnEmpty(task), train_cfg)
    assert str(err.value).startswith("evaluation: the reward function gave eval_accuracy=nan "
                                     "for the held-out prompt ")
    assert str(err.value).endswith("and the completion ''; fix the reward function, or set "
                                   "train.on_reward_error='zero' to score such completions 0 "
                                   "and count them (eval_reward_errors).")
  else:
    (metrics,) = evaluate_models(generate, 1, _NanOnEmpty(task), train_cfg)
    assert metrics == {"eval_accuracy": 0.75, "eval_reward_errors": 1.0}


def test_held_out_scores_of_shape_b_by_1_still_count_and_a_wrong_shape_is_named():
  from grpo_jax.train.run.evaluation import evaluate_models  # noqa: PLC0415
  task = AdditionTask(2, 100, 4, fixed_width=True, reverse_answer=True)
  batch = task.test_batch(4)
  rollout = types.SimpleNamespace(completion_tokens=batch.target_tokens[None],
                                  completion_mask=batch.target_mask[None])
  train_cfg = types.SimpleNamespace(eval_size=4, eval_batch_size=4, eval_pass_k=0,
                                    num_samples=0, on_reward_error="raise",
                                    prompt_bucket=0)

  class Column(_NanOnEmpty):
    def eval_scores(self, batch, tokens, mask):
      return {k: np.asarray(v)[:, None] for k, v in
              self.task.eval_scores(batch, tokens, mask).items()}

  class Short(_NanOnEmpty):
    def eval_scores(self, batch, tokens, mask):
      return {k: np.asarray(v)[:-1] for k, v in
              self.task.eval_scores(batch, tokens, mask).items()}
  assert evaluate_models(lambda *_: rollout, 1, Column(task), train_cfg) == [
      {"eval_accuracy": 1.0}]
  with pytest.raises(faults.RewardError, match=r"returned eval_accuracy of shape \(3,\) for 4 "
                     r"completions; it must return one number per completion, shape \(4,\)"):
    evaluate_models(lambda *_: rollout, 1, Short(task), train_cfg)


@pytest.mark.parametrize("scoring", ["training", "held-out"])
def test_a_reward_function_of_the_wrong_count_for_a_batch_is_bad_input(scoring):
  """A reward function right for one completion and wrong for a batch (round 5's `short_batch`):
  one sentence naming it, the counts and the scoring, as bad input (exit 2), at either scoring;
  it used to blame the task ("failed on the whole batch ... fix its batch handling", exit 1)."""
  from grpo_jax.errors import InputError  # noqa: PLC0415
  from grpo_jax.rewards.functions import RewardCountError  # noqa: PLC0415
  task = AdditionTask(2, 100, 4, fixed_width=True, reverse_answer=True)

  class ShortBatch(_NanOnEmpty):
    def _short(self, tokens):
      if len(tokens) > 1:
        raise RewardCountError(f"reward function 'my_rewards.py:short_batch' returned 1 values "
                               f"for {len(tokens)} completions; return one float per "
                               f"completion.")
    def score(self, batch, tokens, mask, group_size):
      self._short(tokens)
      return self.task.score(batch, tokens, mask, group_size)
    def eval_scores(self, batch, tokens, mask):
      self._short(tokens)
      return self.task.eval_scores(batch, tokens, mask)
  batch = task.test_batch(4)
  tokens, mask = batch.target_tokens, batch.target_mask
  with pytest.raises(InputError) as err:
    if scoring == "training":
      guard.guarded_score(ShortBatch(task), batch, tokens, mask, 1, "raise")
    else:
      guard.guarded_eval_scores(ShortBatch(task), batch, tokens, mask, "raise")
  assert str(err.value) == (f"reward function 'my_rewards.py:short_batch' returned 1 values for "
                            f"4 completions, at the {scoring} scoring (a batch of 4); fix it to "
                            f"return one float per completion, whatever their number.")
  assert isinstance(err.value, faults.RewardError)


def test_a_non_finite_row_leaves_the_batchs_other_values_as_they_were():
  """on_reward_error='zero': a reward that depends on the batch (here the length less the
  batch's mean) keeps its batch values for the good rows; only the NaN row is 0 and failed."""
  class Relative:
    tokenizer = None

    def score(self, prompts, tokens, mask, group_size):
      n = np.asarray(mask).sum(1).astype(float)
      return np.where(n == 0, np.nan, n - n.mean())

  @dataclasses.dataclass
  class Prompts:
    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray

  prompts = Prompts(np.zeros((1, 2), np.int32), np.ones((1, 2), bool))
  mask = np.arange(4)[None] < np.array([4, 2, 1, 0])[:, None]
  rewards, failed = guard.guarded_score(Relative(), prompts, np.zeros((4, 4), np.int32), mask, 4,
                                        "zero")
  np.testing.assert_array_equal(rewards, [2.25, 0.25, -0.75, 0.0])
  np.testing.assert_array_equal(failed, [False, False, False, True])


def test_too_many_failed_rewards_stop_the_step():
  faults.check_reward_error_fraction(3, 6, 0.5, 4)  # half: goes on
  with pytest.raises(faults.RunStopped) as err:
    faults.check_reward_error_fraction(4, 6, 0.5, 4)
  assert str(err.value) == (
      "the rewards of 4 of step 4's 6 completions failed (67%, above "
      "train.max_reward_error_fraction=0.5); fix the reward function (run with "
      "train.on_reward_error='raise' to see the first failure), or raise the limit.")


def test_an_update_that_overflows_the_params_is_reported_and_stops_the_run():
  """Finite loss and gradients, but an infinite learning rate (which config validation refuses;
  here given to the optimizer directly): the update's result is checked (`state_finite` 0),
  and the loop's check stops before any save (the skip guard alone sees only loss and
  gradients)."""
  from tests.test_update import CFG as cfg, _batch_and_state  # noqa: PLC0415
  rl = rl_defaults(num_minibatches=2)
  state, batch, _ = _batch_and_state(rl)
  huge = make_optimizer(types.SimpleNamespace(learning_rate=float("inf"), warmup_steps=0,
                                              weight_decay=0.0, b1=0.9, b2=0.99,
                                              max_grad_norm=1.0), 10)
  state = state.replace(opt_state=huge.init((state.params, state.value_params)))
  update_step = update_lib.make_update_step(cfg, rl, huge, 1.0)
  after, metrics = update_step(state, batch)
  # The first minibatch's loss and gradients are finite (the learning rate is not): its
  # update leaves NaN params, which the step reports.
  assert float(metrics["state_finite"]) == 0.0
  assert int(metrics["skipped_updates"]) == 1  # the second minibatch's loss was NaN
  good, metrics = update_lib.make_update_step(cfg, rl, make_optimizer(
      types.SimpleNamespace(learning_rate=1e-3, warmup_steps=0, weight_decay=0.0, b1=0.9,
                            b2=0.99, max_grad_norm=1.0), 10), 1.0)(*_batch_and_state(rl)[:2])
  assert float(metrics["state_finite"]) == 1.0
  faults.check_state_finite([{"state_finite": 1.0}], 3, lambda: 2)
  with pytest.raises(faults.RunStopped) as err:
    faults.check_state_finite([{"state_finite": 1.0}, {"state_finite": 0.0}], 3, lambda: 2)
  assert str(err.value) == (
      "the update of step 3 made the params or the optimizer state non-finite although its "
      "loss and gradients were finite; nothing of it was saved (the newest checkpoint is step "
      "2), so lower optim.learning_rate or check the model's weights.")


def test_a_second_run_on_a_locked_workdir_stops_naming_the_holder(tmp_path):
  """One run per workdir: while this process holds the lock, `grpo_jax.main` on the same
  workdir stops with one sentence naming our PID and writes nothing; a holder killed with
  SIGKILL leaves no stale lock."""
  from grpo_jax.train.run.workdir import WorkdirBusy, WorkdirLock  # noqa: PLC0415
  workdir = tmp_path / "run"
  with WorkdirLock(str(workdir)):
    out = subprocess.run(_command(workdir), cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    with pytest.raises(WorkdirBusy):
      WorkdirLock(str(workdir)).__enter__()
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [
      f"error: the workdir {workdir} is in use by another run (PID {os.getpid()}); wait for "
      f"it to end, stop it, or pass another --workdir."]
  assert sorted(os.listdir(workdir)) == [".lock"]
  holder = subprocess.Popen([sys.executable, "-c", (
      "import sys, time; from grpo_jax.train.run.workdir import WorkdirLock; "
      f"WorkdirLock({str(workdir)!r}).__enter__(); print('held', flush=True); time.sleep(60)")],
      cwd=ROOT, stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == "held"
  with pytest.raises(WorkdirBusy, match=f"PID {holder.pid}"):
    WorkdirLock(str(workdir)).__enter__()
  holder.kill()
  holder.wait(timeout=60)
  with WorkdirLock(str(workdir)):  # free again
    pass


@pytest.mark.slow
def test_an_unreadable_newest_checkpoint_stops_the_run_and_stays_in_place(reference, tmp_path,
                                                                           env, monkeypatch):
  """The newest checkpoint's files made unreadable (chmod 0; as root, who reads through any
  mode, its reads also refused with PermissionError): the checkpoint is intact, so the run
  stops in one sentence naming the permission problem and moves nothing (it used to be taken
  for a damaged one and moved aside, its steps lost to the resume). Readable again, the workdir
  resumes from it and reproduces the uninterrupted run."""
  import builtins  # noqa: PLC0415
  import shutil  # noqa: PLC0415
  from grpo_jax.train.run.checkpoint import Checkpoints  # noqa: PLC0415
  from tests.tiny_runs import N, records, run, strip, template  # noqa: PLC0415
  ref_dir, ref_records = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  newest = workdir / "checkpoints" / str(2 * N)
  files = [p for p in newest.rglob("*") if p.is_file()]
  for path in files:
    path.chmod(0)
  if os.geteuid() == 0:
    refused, real_open = {str(p) for p in files}, builtins.open
    def open_unless_refused(file, *args, **kwargs):
      if str(file) in refused:
        raise PermissionError(13, "Permission denied", str(file))
      return real_open(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", open_unless_refused)
  before = sorted(os.listdir(workdir / "checkpoints"))
  ckpts = Checkpoints(workdir / "checkpoints", 3, log=(logged := []).append)
  with pytest.raises(faults.RunStopped) as err:
    ckpts.restore_latest(template())
  ckpts.close()
  monkeypatch.undo()
  assert str(err.value).startswith(f"checkpoint {workdir}/checkpoints/{2 * N} cannot be read "
                                   f"by this user (PermissionError: ")
  assert str(err.value).endswith(f"fix its permissions (e.g. chmod -R u+rwX {workdir}/"
                                 f"checkpoints) and run again; nothing was moved.")
  assert logged == [] and sorted(os.listdir(workdir / "checkpoints")) == before
  for path in files:
    path.chmod(0o644)
  stdout = run(workdir, env, f"--config.train.steps={2 * N}")
  assert f"resumed from checkpoint {workdir}/checkpoints/{2 * N}" in stdout
  assert strip(records(workdir)) == strip(ref_records)


_FAILED_RESTORE = """
import sys, jax, jax.numpy as jnp
from grpo_jax import errors
from grpo_jax.train.learner.state import TrainState
from grpo_jax.train.run.checkpoint import Checkpoints
from grpo_jax.train.run.faults import RunStopped
def state(rows, step=0):
  i = jnp.zeros((), jnp.int32)
  return TrainState(step + i, {f"w{k}": jnp.ones((rows, 128, 4)) for k in range(40)}, None,
                    None, None, jnp.zeros(()), jax.random.key(0), i, i, i)
ckpts = Checkpoints(sys.argv[1], 3, log=print)
for step in range(3):
  ckpts.save(state(2, step))
errors.mute_after_a_failed_save()  # as the command line does
try:
  ckpts.restore_latest(jax.eval_shape(lambda: state(3)))
except RunStopped as e:
  print(f"error: {str(e).split(' can be restored')[0]}", file=errors.last_word_stream())
"""


def test_a_restore_that_fails_for_every_checkpoint_ends_in_one_sentence(tmp_path):
  """A model changed under train.allow_config_change: no checkpoint restores, and orbax's
  abandoned reads used to print some 400 lines of tracebacks ("Event loop is closed", "Task
  exception was never retrieved") around the run's one sentence, as a failed save did."""
  out = subprocess.run([sys.executable, "-c", _FAILED_RESTORE, str(tmp_path / "ckpts")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stderr.splitlines() == [
      f"error: no checkpoint in {tmp_path / 'ckpts'} (steps [0, 1, 2])"]
  assert out.stdout.count("cannot be restored") == 3


def test_a_command_line_run_in_process_gives_stderr_back(capfd):
  """A failed save or restore on the command line points fd 2 and sys.stderr at /dev/null for
  the rest of the process (orbax's threads print on); run in-process (main.cli, as tests do),
  the command line's return gives them back, so the caller's later errors are seen (a test
  after it in the same pytest worker captured nothing)."""
  from grpo_jax import errors  # noqa: PLC0415
  from grpo_jax.main import cli  # noqa: PLC0415

  def entry(argv):
    del argv
    errors.mute_after_a_failed_save()
    assert errors.silence_stderr_for_good(os.dup(2))  # what a failed save or restore does
    print("orbax's tracebacks", file=sys.stderr, flush=True)
  assert cli(["--config=configs/grpo_tiny.py", "--workdir=/nonexistent"], entry=entry) == 0
  print("seen", file=sys.stderr, flush=True)
  os.write(2, b"and fd 2\n")
  assert capfd.readouterr().err == "seen\nand fd 2\n"


def test_a_reward_past_float32s_range_counts_as_not_finite():
  """1e39 is finite in float64 but inf in float32, the dtype the run learns in: failed, 0."""
  task = AdditionTask(2, 100, 4, fixed_width=True, reverse_answer=True)
  prompts = task.encode(np.array([[7, 68]]))
  tokens, mask = np.zeros((2, 4), np.int32), np.ones((2, 4), bool)
  huge = type("Huge", (), {"tokenizer": task.tokenizer,
                           "score": lambda self, *a: np.array([1e39, 0.5])})()
  rewards, failed = guard.guarded_score(huge, prompts, tokens, mask, 2, "zero")
  np.testing.assert_array_equal(rewards, [0, 0.5])
  np.testing.assert_array_equal(failed, [True, False])
