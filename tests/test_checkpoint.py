"""Checkpoints and faults: SIGKILL + resume reproduces the uninterrupted run, SIGTERM saves the
current step, a damaged latest checkpoint falls back, non-finite gradients are skipped and stop
the run, failing rewards stop it (or score 0), and the workdir records its provenance."""

import json
import os
import random
import signal
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import grpo_tiny
from grpo_jax.config import ConfigError, validate
from grpo_jax.defaults import rl_defaults
from grpo_jax.data.arithmetic import AdditionTask
from grpo_jax.rollout.types import Rollout
from grpo_jax.rewards import guard
from grpo_jax.train.run import faults
from grpo_jax.train.learner import update as update_lib
from grpo_jax.train.run.checkpoint import Checkpoints
from grpo_jax.train.sources.collect import Samplers, collect, score_round
from grpo_jax.train.sources.experience_source import SourceSettings
from grpo_jax.train.stages.rl import train
from grpo_jax.train.run.metrics import keep_records_until
from grpo_jax.train.run.seed_axis import SeedAxis
from tests.tiny_runs import N, ROOT, assert_trees_equal as _assert_trees_equal
from tests.tiny_runs import command as _command, raw_state as _raw_state, records as _records
from tests.tiny_runs import run as _run, start_and_signal as _start_and_signal, strip
from tests.tiny_runs import template as _template


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(reference, tmp_path, env):
  ref_dir, ref_records = reference
  assert [r["step"] for r in ref_records] == list(range(2 * N + 1))
  assert sorted(int(d) for d in os.listdir(ref_dir / "checkpoints")) == [0, N, 2 * N]
  rng = random.Random()
  at_step, delay = rng.choice(range(N + 1, 2 * N)), rng.uniform(0.0, 0.05)
  workdir = tmp_path / "run"
  code, stderr, _ = _start_and_signal(workdir, env, signal.SIGKILL, at_step, delay)
  where = f"killed after the progress line of step {at_step} + {delay:.3f}s"
  assert code == -signal.SIGKILL, (where, stderr[-2000:])
  killed_at = len(_records(workdir)) - 1
  assert killed_at >= at_step, where  # records past the step-N checkpoint were written
  stdout = _run(workdir, env)
  assert f"resumed from checkpoint {workdir}/checkpoints/{N} (no warm-up)" in stdout, where
  assert "warm-up" not in stdout.replace("(no warm-up)", "")
  # Every record, those after the resume point included (data order, rewards, KL, loss,
  # evaluation), equals the uninterrupted run's; so does the whole final state, bit for bit.
  assert strip(_records(workdir)) == strip(ref_records), where
  final, ref_final = _raw_state(workdir, 2 * N), _raw_state(ref_dir, 2 * N)
  _assert_trees_equal(final, ref_final)
  assert int(final["source"]["data_position"]) == 2 * N * 4 and float(final["kl_coef"]) != 0.02
  assert int(final["source"]["rollouts"]) == 2 * N
  # The workdir records its config, versions and code; the resume is a second start.
  starts = json.loads((workdir / "run_info.json").read_text())["starts"]
  assert [s["resumed_from_step"] for s in starts] == [None, N]
  assert starts[0]["versions"]["jax"] == jax.__version__
  git = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
  assert starts[0]["git_commit"] == (git.stdout.strip() if git.returncode == 0 else None)
  assert json.loads((workdir / "config.json").read_text())["train"]["checkpoint_every"] == N


@pytest.mark.slow
def test_sigterm_saves_the_current_step_and_a_damaged_latest_falls_back(tmp_path, env):
  workdir = tmp_path / "run"
  code, stderr, _ = _start_and_signal(workdir, env, signal.SIGTERM, 2, 0.0,
                                   "--config.train.checkpoint_every=100")
  assert code == faults.PREEMPTED_EXIT_CODE, stderr[-2000:]
  stopped = _records(workdir)[-1]["step"]
  assert 2 <= stopped < 2 * N
  assert f"SIGTERM: saved checkpoint {workdir}/checkpoints/{stopped}" in stderr
  ckpts = Checkpoints(workdir / "checkpoints", 3, log=(logged := []).append)
  assert ckpts.steps() == [0, stopped]
  template = _template()
  state = ckpts.restore_latest(template)
  assert int(state.step) == stopped and int(state.source.data_position) == stopped * 4 and not logged
  # Truncate the largest file of the latest checkpoint: restoring falls back to step 0.
  latest = workdir / "checkpoints" / str(stopped)
  largest = max((p for p in latest.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  os.truncate(largest, largest.stat().st_size // 2)
  state = ckpts.restore_latest(template)
  ckpts.close()
  assert int(state.step) == 0 and len(logged) == 1
  assert logged[0].startswith(f"warning: checkpoint {workdir}/checkpoints/{stopped} cannot be "
                              f"restored (") and logged[0].endswith("trying the one before it.")
  assert os.path.isdir(f"{latest}.unreadable") and not latest.exists()
  # That the command then resumes from step 0 and reproduces the uninterrupted run is the claim
  # of the next test (the same fallback, three kinds of damage); a signal's checkpoint resumed
  # is test_signals.py's SIGINT case.


@pytest.mark.slow
def test_each_damaged_step_folder_falls_back_to_the_newest_intact_one(reference, tmp_path,
                                                                      env):
  """Three kinds of damage at once in a copy of the reference run (checkpoints 0, 3, 6): an
  empty step folder 9, 4 KiB of flipped bytes in step 6 (caught by its CRC-32 record), step 3's
  item folder deleted. Each is moved aside with one warning, step 0 is restored, nothing intact
  is touched, and the resumed command reproduces the uninterrupted run."""
  import shutil  # noqa: PLC0415
  ref_dir, ref_records = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  root = workdir / "checkpoints"
  assert all((root / str(s) / "crc32.json").is_file() for s in (0, N, 2 * N))
  (root / "9").mkdir()
  largest = max((p for p in (root / str(2 * N)).rglob("*") if p.is_file()
                 and p.name != "crc32.json"), key=lambda p: p.stat().st_size)
  with open(largest, "r+b") as f:
    f.seek(largest.stat().st_size // 2)
    chunk = f.read(4096)
    f.seek(largest.stat().st_size // 2)
    f.write(bytes(b ^ 0xFF for b in chunk))
  shutil.rmtree(root / str(N) / "default")
  ckpts = Checkpoints(root, 3, log=(logged := []).append)
  state = ckpts.restore_latest(_template())
  ckpts.close()
  assert int(state.step) == 0
  assert [line.split(" cannot be restored")[0] for line in logged] == [
      f"warning: checkpoint {root}/{s}" for s in (9, 2 * N, N)]
  assert "CRC-32" in logged[1] and "delete" not in " ".join(logged)
  assert sorted(os.listdir(root)) == ["0", f"{N}.unreadable", f"{2 * N}.unreadable",
                                      "9.unreadable"]
  stdout = _run(workdir, env)
  assert f"resumed from checkpoint {root}/0" in stdout
  assert strip(_records(workdir)) == strip(ref_records)


def _nan_grad_loss(monkeypatch, always: bool):
  """Patches the update's loss: same value, but a NaN gradient for one weight matrix, always
  or only for a batch marked by non-zero old_values (unused without a critic, where an unmarked
  batch has none)."""
  @jax.custom_vjp
  def nan_grad(x, scale):
    return x

  nan_grad.defvjp(lambda x, scale: (x, scale),
                  lambda scale, g: (jax.tree.map(lambda t: t * scale, g), None))
  original = update_lib.loss_and_sums

  def loss(trainable, mb, *args, **kwargs):
    params, value_params = trainable
    on = always or (mb.old_values is not None and jnp.any(mb.old_values != 0))
    scale = jnp.where(on, jnp.nan, 1.0)
    params = {**params, "embed_tokens": nan_grad(params["embed_tokens"], scale)}
    return original((params, value_params), mb, *args, **kwargs)

  monkeypatch.setattr(update_lib, "loss_and_sums", loss)


def test_injected_nan_gradient_leaves_params_unchanged_and_is_counted(monkeypatch):
  from tests.test_update import CFG as cfg, _batch_and_state  # noqa: PLC0415
  rl = rl_defaults(num_minibatches=2)
  state, batch, optimizer = _batch_and_state(rl)
  _nan_grad_loss(monkeypatch, always=False)
  update_step = update_lib.make_update_step(cfg, rl, optimizer, 1.0)
  assert batch.old_values is None  # no critic
  marked = batch._replace(old_values=jnp.ones_like(batch.advantages))
  after, metrics = update_step(state, marked)
  assert np.isfinite(float(metrics["loss"])) and not np.isfinite(float(metrics["grad_norm"]))
  _assert_trees_equal((after.params, after.opt_state), (state.params, state.opt_state))
  assert int(after.skipped_updates) == 2 and int(after.consecutive_skips) == 2
  assert int(metrics["skipped_updates"]) == 2 and int(after.step) == 1
  # A clean batch trains again and resets the run of skips, not the total.
  again, metrics = update_step(after, batch)
  assert np.isfinite(float(metrics["grad_norm"])) and float(metrics["grad_norm"]) > 0
  assert int(again.skipped_updates) == 2 and int(again.consecutive_skips) == 0
  delta = optax.tree.norm(jax.tree.map(jnp.subtract, again.params, after.params))
  assert float(delta) > 1e-4


def test_consecutive_skips_stop_the_run_with_finite_unchanged_params(monkeypatch, tmp_path):
  _nan_grad_loss(monkeypatch, always=True)
  config = grpo_tiny.get_config()
  config.warmup.steps = 0
  config.rollout.update(num_prompts=4, group_size=4)
  config.rl.num_minibatches = 2
  config.train.update(steps=4, eval_size=20, eval_batch_size=20, checkpoint_every=1,
                      max_consecutive_skips=3)
  with pytest.raises(faults.RunStopped, match=r"^4 optimizer updates in a row were skipped .*"
                     r"at step 2, train.max_consecutive_skips=3\)"):
    train(config, str(tmp_path), log=lambda *a: None)
  records = _records(tmp_path)
  assert [(r["step"], r.get("skipped_updates")) for r in records] == [(0, None), (1, 2), (2, 4)]
  ckpts = Checkpoints(tmp_path / "checkpoints", 3)
  assert ckpts.steps() == [0, 1]  # the step that stopped the run is not saved
  ckpts.close()
  first, second = _raw_state(tmp_path, 0), _raw_state(tmp_path, 1)
  _assert_trees_equal((first["params"], first["opt_state"]),
                      (second["params"], second["opt_state"]))
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(second["params"]))


class _FlakyReward:
  """The addition task, whose reward raises on one completion text and is NaN on another."""

  def __init__(self, task, raise_text, nan_text):
    self.task, self.tokenizer = task, task.tokenizer
    self.raise_text, self.nan_text = raise_text, nan_text

  def score(self, batch, tokens, mask, group_size):
    rewards = self.task.score(batch, tokens, mask, group_size)
    texts = [self.tokenizer.decode(t) for t in np.asarray(tokens)]
    if self.raise_text in texts:
      raise ZeroDivisionError("reward bug")
    rewards = np.asarray(rewards, np.float32).copy()
    rewards[[i for i, t in enumerate(texts) if t == self.nan_text]] = np.nan
    return rewards

  def step_rewards(self, batch, tokens, mask, group_size):
    return self.task.step_rewards(batch, tokens, mask, group_size)


@pytest.mark.parametrize("mode", ["raise", "zero"])
def test_failing_reward_stops_the_run_or_scores_zero(mode):
  task = AdditionTask(2, 100, 4, fixed_width=True, reverse_answer=True)
  prompts = task.encode(np.array([[7, 68], [12, 30]]))
  tokenize = lambda s: task.tokenizer.encode(s, eos=True) + [0] * (4 - len(s) - 1)  # noqa
  answers = ["570", "11", "24", "93", "042", "240"]  # rows 0-2: 07+68; rows 3-5: 12+30
  tokens = np.array([tokenize(a) for a in answers], np.int32)
  mask = np.array([[i <= len(a) for i in range(4)] for a in answers])
  flaky = _FlakyReward(task, raise_text="11", nan_text="240")
  expected = task.score(prompts, tokens, mask, 3)
  np.testing.assert_array_equal(expected, [1, 0, 0, 0, 0, 1])
  if mode == "raise":
    with pytest.raises(faults.RewardError, match=r"^the reward function raised "
                       r"ZeroDivisionError: reward bug for the prompt '07\+68=' and the "
                       r"completion '11';.*on_reward_error='zero'") as info:
      guard.guarded_score(flaky, prompts, tokens, mask, 3, mode)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    flaky.raise_text = None
    with pytest.raises(faults.RewardError, match=r"returned nan .* prompt '12\+30=' and the "
                       r"completion '240'"):
      guard.guarded_score(flaky, prompts, tokens, mask, 3, mode)
    return
  rewards, failed = guard.guarded_score(flaky, prompts, tokens, mask, 3, mode)
  np.testing.assert_array_equal(rewards, [1, 0, 0, 0, 0, 0])  # rows 1 and 5 scored 0
  np.testing.assert_array_equal(failed, [False, True, False, False, False, True])
  # The step rewards (process supervision) of the completions scored 0 are 0 too: they come
  # with the rewards from collect's score_round when the estimator needs them.
  rollout = Rollout(np.repeat(prompts.prompt_tokens, 3, 0), np.repeat(prompts.prompt_mask, 3, 0),
                    tokens, mask, np.zeros(mask.shape, np.float32), np.zeros(len(tokens), bool),
                    mask)
  rewards, extras, errors, _, _ = score_round(flaky, prompts, rollout, None, 3, mode,
                                        needs=("step_rewards",))
  np.testing.assert_array_equal(rewards, [1, 0, 0, 0, 0, 0])
  steps = extras["step_rewards"]
  assert errors == 2 and steps[0].shape == (6, 4)
  assert np.all(steps[0][[1, 5]] == 0) and steps[0][0].sum() == 4  # 3 digits + <eos>


class _NanWhenRight:
  """The addition task, whose reward is NaN wherever it should be 1."""

  def __init__(self, task):
    self.task = task

  def __getattr__(self, name):
    return getattr(self.task, name)

  def score(self, batch, tokens, mask, group_size):
    rewards = self.task.score(batch, tokens, mask, group_size)
    return np.where(np.asarray(rewards) == 1, np.nan, rewards)


def test_collect_counts_zeroed_rewards_or_stops():
  from tests.test_collect import _ScriptedSampler  # noqa: PLC0415
  task = AdditionTask(2, 100, 4, True, True)

  def run(task, on_reward_error="raise"):
    settings = SourceSettings("host", num_prompts=6, group_size=4,
                              on_reward_error=on_reward_error)
    (out,) = collect(None, [0], [jax.random.key(0)], task, settings,
                     Samplers(sample=_ScriptedSampler(task, 4), greedy=None), SeedAxis((0,)),
                     needs=("step_rewards",))
    return out

  clean = run(task)
  assert float(np.sum(clean.inputs.rewards)) == 4 and clean.reward_errors == 0
  out = run(_NanWhenRight(task), on_reward_error="zero")
  np.testing.assert_array_equal(np.asarray(out.rollout.completion_tokens),
                                np.asarray(clean.rollout.completion_tokens))
  assert out.reward_errors == 4 and float(np.abs(out.inputs.rewards).sum()) == 0
  with pytest.raises(faults.RewardError, match=r"^the reward function returned nan"):
    run(_NanWhenRight(task))
  steps, clean_steps = out.inputs.extras["step_rewards"], clean.inputs.extras["step_rewards"]
  assert float(np.abs(steps[0]).sum()) < float(clean_steps[0].sum())


def test_metrics_resume_keeps_records_up_to_the_restored_step(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(5))
                  + '{"step": 5, "lo')  # a record cut short by SIGKILL
  assert keep_records_until(str(path), 2) == 3
  assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2]
  assert keep_records_until(str(path), -1) == 3 and path.read_text() == ""
  # A blank or torn line in the middle: the valid records after it are kept, the file is
  # replaced whole (no temporary left behind).
  lines = [json.dumps({"step": s}) for s in range(6)]
  path.write_text("\n".join(lines[:2] + ["", '{"step": 2, "lo'] + lines[3:]) + "\n")
  assert keep_records_until(str(path), 4) == 3
  assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 3, 4]
  assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]


@pytest.mark.parametrize("field, value, message", [
    ("on_reward_error", "ignore", "train.on_reward_error='ignore' is unknown; valid: raise, "
     "zero."),
    ("keep_checkpoints", 0, "train.keep_checkpoints=0; keep at least 1"),
    ("max_consecutive_skips", 0, "train.max_consecutive_skips=0; use at least 1."),
    ("checkpoint_every", -1, "train.checkpoint_every=-1; use a number of steps >= 0")])
def test_fault_config_fields_are_validated(field, value, message):
  config = grpo_tiny.get_config()
  config.train[field] = value
  with pytest.raises(ConfigError) as info:
    validate(config)
  assert str(info.value).startswith(message)




@pytest.mark.slow
def test_resume_under_a_changed_config_is_refused_unless_allowed(capfd, reference, tmp_path,
                                                                  env):
  """A workdir with checkpoints resumes under its recorded config only: a changed learning
  rate stops with one sentence naming the field, before config.json or anything else is
  rewritten (the command line in this process: the refusal comes before any compute); with
  train.allow_config_change it resumes and run_info.json records the change. Changing only
  the run's length is free (and recorded)."""
  import shutil  # noqa: PLC0415

  from grpo_jax.main import cli  # noqa: PLC0415
  ref_dir, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  before = {name: (workdir / name).read_bytes() for name in ("config.json", "run_info.json",
                                                             "metrics.jsonl")}
  capfd.readouterr()
  code = cli(_command(workdir, "--config.optim.learning_rate=0.001")[3:])
  err = capfd.readouterr().err
  assert code == 2, err[-2000:]
  lines = err.strip().splitlines()
  assert lines[-1] == (
      f"error: resuming {workdir} under a config that differs from its config.json "
      f"(optim.learning_rate 0.0002 -> 0.001); run with its recorded config, pass another "
      f"--workdir, or pass --config.train.allow_config_change=True to resume anyway (the "
      f"changes are recorded in run_info.json).")
  assert {name: (workdir / name).read_bytes() for name in before} == before
  _run(workdir, env, f"--config.train.steps={2 * N + 1}", "--config.optim.learning_rate=0.001",
       "--config.train.allow_config_change=True")
  starts = json.loads((workdir / "run_info.json").read_text())["starts"]
  assert starts[-1]["resumed_from_step"] == 2 * N
  assert starts[-1]["config_changes"] == {
      "optim.learning_rate": [0.0002, 0.001], "train.allow_config_change": [False, True],
      "train.steps": [2 * N, 2 * N + 1]}
  assert json.loads((workdir / "config.json").read_text())["optim"]["learning_rate"] == 0.001


def test_a_field_added_since_the_record_at_its_default_is_no_change(tmp_path):
  """A workdir written before a config field existed resumes under the new code: the field the
  record lacks counts as a change only when the config sets it away from its default."""
  from grpo_jax.train.run.workdir import config_changes  # noqa: PLC0415
  config = grpo_tiny.get_config()
  record = json.loads(config.to_json_best_effort(sort_keys=True))
  del record["train"]["export_dtype"], record["data"]["system_prompt"]
  (tmp_path / "config.json").write_text(json.dumps(record))
  assert config_changes(config, str(tmp_path)) == {}
  config.data.system_prompt = "Be brief."
  assert config_changes(config, str(tmp_path)) == {"data.system_prompt": [None, "Be brief."]}


def test_runs_without_kl_hold_no_reference_and_read_older_checkpoints(tmp_path):
  """With rl.kl_coef == 0 the state holds no reference copy (nothing reads it); a checkpoint
  written with one (before this rule) restores into such a state, the copy dropped, every
  other leaf bit for bit."""
  from grpo_jax.train.learner.state import create_train_state
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.float32(0.5)}
  optimizer = optax.adam(1e-3)
  assert create_train_state(params, optimizer, jax.random.key(0)).ref_params is None
  older = create_train_state(params, optimizer, jax.random.key(0), kl_coef=0.1)
  older = older.replace(step=jnp.int32(3), kl_coef=jnp.float32(0.0))
  assert older.ref_params is not None
  ckpts = Checkpoints(str(tmp_path / "ckpt"), keep=2, log=lambda *_: None)
  ckpts.save(older)
  template = jax.eval_shape(lambda: create_train_state(params, optimizer, jax.random.key(0)))
  restored = ckpts.restore_latest(template)
  ckpts.close()
  assert restored.ref_params is None
  _assert_trees_equal(restored.replace(key=jax.random.key_data(restored.key)),
                      older.replace(ref_params=None, key=jax.random.key_data(older.key)))
