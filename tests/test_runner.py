"""A new training objective on the loop skeleton (grpo_jax/train/run/runner.py) is this one file: a
toy regression stage (fit y = 3x - 1 by SGD on a deterministic data stream) gets step 0's
evaluation, the evaluation cadence, checkpoints, SIGTERM and an exact resume from the
skeleton."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.train.run.checkpoint import Checkpoints
from grpo_jax.train.run.faults import Preempted, TerminationFlag
from grpo_jax.train.run.runner import Schedule, run_steps
from grpo_jax.train.learner.state import create_train_state

SCHEDULE = Schedule(steps=6, eval_every=3, checkpoint_every=2)
OPTIMIZER = optax.sgd(0.1)


def _batch(position):
  x = jnp.sin(position + jnp.arange(8, dtype=jnp.float32))
  return x, 3.0 * x - 1.0


def _loss(params, x, y):
  return jnp.mean(jnp.square(params["w"] * x + params["b"] - y))


@jax.jit
def _step(state):
  x, y = _batch(8 * state.step)
  loss, grads = jax.value_and_grad(_loss)(state.params, x, y)
  updates, opt_state = OPTIMIZER.update(grads, state.opt_state, state.params)
  return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                       opt_state=opt_state), loss


def _stage(workdir, stop_after=None):
  """Runs the stage in `workdir` (resuming from its newest checkpoint); returns the records it
  wrote and the final state. stop_after=k: a SIGTERM arrives during the k-th call."""
  fresh = lambda: create_train_state({"w": jnp.float32(0.0), "b": jnp.float32(0.0)},  # noqa: E731
                                     OPTIMIZER, jax.random.key(0))
  written, calls = [], []
  ckpts = Checkpoints(str(workdir), keep=10, log=lambda *_: None)
  try:
    with TerminationFlag() as sigterm:
      def advance(state):
        calls.append(1)
        if stop_after is not None and len(calls) == stop_after:
          sigterm.requested = True  # as the handler does
        state, loss = _step(state)
        return state, [[{"loss": float(loss)}]], None

      def evaluate(state, step):
        x, y = _batch(10_000)  # held out
        return [{"eval_loss": float(_loss(state.params, x, y))}]

      def write(state, first, records, tokens, seconds, clock):
        for i, per_seed in enumerate(records):
          written.append((first + i, dict(per_seed[0])))

      state = ckpts.restore_latest(jax.eval_shape(fresh))
      resumed = state is not None
      state = run_steps(state if resumed else fresh(), advance, evaluate, write,
                        schedule=SCHEDULE, ckpts=ckpts, sigterm=sigterm, resumed=resumed)
  finally:
    ckpts.close()
  return written, state


def test_a_toy_stage_runs_on_the_skeleton_and_resumes_exactly(tmp_path):
  whole, state = _stage(tmp_path / "whole")
  assert [s for s, _ in whole] == [0, 1, 2, 3, 4, 5, 6]
  assert [s for s, r in whole if "eval_loss" in r] == [0, 3, 6]
  assert whole[-1][1]["eval_loss"] < 0.5 * whole[0][1]["eval_loss"]  # it learns
  assert Checkpoints(str(tmp_path / "whole"), 10).steps() == [0, 2, 4, 6]

  with pytest.raises(Preempted):  # SIGTERM in the 3rd call: step 3 is saved, then it stops
    _stage(tmp_path / "split", stop_after=3)
  first_part = Checkpoints(str(tmp_path / "split"), 10)
  assert first_part.steps()[-1] == 3
  first_part.close()
  rest, resumed = _stage(tmp_path / "split")
  assert rest == whole[4:]  # the records of steps 4.. equal, bit for bit
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
