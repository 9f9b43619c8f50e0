"""The tiny command-line runs that the checkpoint, fault and signal tests share: a 2N-step
configuration in which every piece of the state moves, ways to run, signal and read it, and
the session's uninterrupted reference run (the `reference` fixture in conftest.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from grpo_jax.train.run.metrics import TIMING_KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 3  # checkpoint every N steps; runs are 2N steps
# Every piece of the state moves: a separate critic, an adaptive KL coefficient, a refreshed
# reference, shuffled minibatches.
SMALL = ["--config.warmup.steps=10", f"--config.train.steps={2 * N}", "--config.train.eval_every=3",
         "--config.train.eval_size=40", "--config.train.eval_batch_size=20",
         "--config.rollout.num_prompts=4", "--config.rollout.group_size=4",
         "--config.rl.num_minibatches=2", "--config.rl.value_head=separate",
         "--config.rl.adaptive_kl=True", "--config.rl.kl_target=0.001",
         "--config.rl.ref_update_every=2", "--config.rl.ref_mix=0.5",
         f"--config.train.checkpoint_every={N}", "--config.train.keep_checkpoints=3",
         "--config.rollout.decode_slots=5"]  # the slot-refill engine, 5 slots for 16 rows


def strip(records):
  """Records without their wall-clock fields."""
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def cache_env(cache_dir) -> dict:
  """Subprocess environment sharing a persistent compilation cache (same programs, faster): the
  test session's own, with its settings (tests/conftest.py's pytest_configure), when it has
  one; else `cache_dir`, every program kept."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return dict(os.environ)
  return {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def command(workdir, *extra):
  return [sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
          f"--workdir={workdir}", *SMALL, *extra]


def run(workdir, env, *extra):
  out = subprocess.run(command(workdir, *extra), cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def _default_signals():
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_and_signal(workdir, env, sig, at_step, delay: float, *extra):
  """Starts a run, sends `sig` `delay` seconds after its progress line for `at_step` (an int:
  "step <at_step>/"; a str: the first stdout line starting with it); returns (exit status,
  stderr, seconds from the signal to the exit)."""
  err = open(os.path.join(workdir.parent, f"{workdir.name}.stderr"), "w+")
  # The run gets SIGINT's and SIGHUP's default dispositions whatever the launcher's: a test
  # suite started in the background of a non-interactive shell inherits SIGINT ignored, and one
  # started under `nohup` SIGHUP ignored, which the run then rightly keeps ignoring (faults.py):
  # the SIGHUP tests waited out a whole run (an hour, 2026-12-05) instead of testing a stop.
  proc = subprocess.Popen(command(workdir, *extra), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=err, text=True, env=env, preexec_fn=_default_signals)
  prefix = at_step if isinstance(at_step, str) else f"step {at_step:>4}/"
  sent = None
  for line in proc.stdout:
    if line.startswith(prefix):
      time.sleep(delay)
      proc.send_signal(sig)
      sent = time.perf_counter()
      break
  proc.stdout.read()
  proc.wait(timeout=600)
  waited = time.perf_counter() - sent if sent is not None else None
  err.seek(0)
  return proc.returncode, err.read(), waited


def records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def raw_state(workdir, step):
  """A checkpoint as saved (nested dicts of arrays), read without any template."""
  return ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", str(step),
                                                         "default"))


def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def template():
  """The abstract RunState of the SMALL runs (shapes and dtypes only)."""
  from configs import grpo_tiny  # noqa: PLC0415
  from grpo_jax.train.stages.rl import initial_state  # noqa: PLC0415
  from grpo_jax.train.run.sections import ModelSection  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_model  # noqa: PLC0415
  from grpo_jax.train.learner.state import RunState, create_source_state, make_optimizer  # noqa: PLC0415
  config = grpo_tiny.get_config()
  config.rl.value_head = "separate"
  model_cfg, params = build_model(ModelSection.of(config), jax.random.key(0))
  optimizer = make_optimizer(config.optim, 1)
  def state(p, k):
    train = initial_state(config.rl, model_cfg, p, optimizer, k)
    return RunState(train, create_source_state(train.key))
  return jax.eval_shape(state, params, jax.random.key(0))
