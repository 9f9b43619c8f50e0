"""A step without signal (issue 76): the optax-style rule (grpo_jax/train/learner/skips.py)
against the plain optimizer and optax.MultiSteps, and the RL update, after steps with a signal,
leaving params and optimizer state bit-identical on a step whose gradient is exactly zero."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax.defaults import rl_defaults
from grpo_jax.train.learner.skips import has_signal, skip_without_signal
from grpo_jax.train.learner.state import guarded_apply
from grpo_jax.train.learner.update import make_update_step
from tests.test_update import CFG, _batch_and_state


def _leaves_equal(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_the_rule_against_the_plain_optimizer_and_multisteps():
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  opt = optax.adamw(optax.linear_schedule(0.0, 1e-2, 10), weight_decay=0.1)
  multi = optax.MultiSteps(opt, 1, should_skip_update_fn=skip_without_signal)
  grads = [jax.tree.map(lambda p, i=i: jnp.sin(p + i), params) for i in range(3)]
  zero = jax.tree.map(jnp.zeros_like, params)
  p_plain, s_plain = params, opt.init(params)
  p_ours, s_ours = params, opt.init(params)
  p_multi, s_multi = params, multi.init(params)
  for g in grads[:2] + [zero] + grads[2:]:
    if has_signal(g):  # the plain optimizer sees only the steps with a signal
      u, s_plain = opt.update(g, s_plain, p_plain)
      p_plain = optax.apply_updates(p_plain, u)
    p_ours, s_ours, finite, signal = guarded_apply(p_ours, s_ours, g, jnp.float32(0.0), opt,
                                                   skip_without_signal=True)
    assert bool(finite) and bool(signal) == bool(has_signal(g))
    u, s_multi = multi.update(g, s_multi, p_multi)
    p_multi = optax.apply_updates(p_multi, u)
  np.testing.assert_allclose(p_ours["w"], p_plain["w"], rtol=0, atol=1e-7)
  np.testing.assert_allclose(p_multi["w"], p_plain["w"], rtol=0, atol=1e-7)
  assert int(s_ours[0].count) == 3 and int(s_multi.gradient_step) == 3  # not 4
  # The plain optimizer on the zero gradient moves the params (momentum, decay) and the count.
  u, s_moved = opt.update(zero, s_plain, p_plain)
  assert float(jnp.max(jnp.abs(u["w"]))) > 1e-4 and int(s_moved[0].count) == 4
  # Off, the guard is the plain optimizer: the zero step applied.
  _, s_off, _, signal = guarded_apply(p_plain, s_plain, zero, jnp.float32(0.0), opt)
  assert bool(signal) and int(s_off[0].count) == 4
  # A NaN is not "no signal": the finiteness guard refuses it, counted as such.
  _, _, finite, signal = guarded_apply(params, opt.init(params), {"w": jnp.full((2, 3), jnp.nan),
                                       "b": jnp.zeros(3)}, jnp.float32(0.0), opt,
                                       skip_without_signal=True)
  assert not bool(finite) and bool(signal)


def test_a_step_without_signal_leaves_params_and_optimizer_state_bit_identical():
  """Two steps with a signal, then one whose every advantage is 0 (every group tied, no KL,
  entropy or value term): params, moments and count unchanged, counted in no_signal_updates;
  under rl.skip_without_signal=False AdamW's momentum moves the params, as before."""
  rl = rl_defaults(kl_coef=0.0)
  state, batch, optimizer = _batch_and_state(rl)
  update = make_update_step(CFG, rl, optimizer, 1.0, 4)
  for _ in range(2):
    state, metrics = update(state, batch)
    assert float(metrics["grad_norm"]) > 0 and int(metrics["no_signal_updates"]) == 0
  tied = batch._replace(advantages=jnp.zeros_like(batch.advantages))
  before = jax.tree.map(np.asarray, (state.params, state.opt_state))
  after, metrics = update(state, tied)
  assert _leaves_equal((after.params, after.opt_state), before)
  assert int(metrics["no_signal_updates"]) == 1 and int(metrics["skipped_updates"]) == 0
  assert float(metrics["grad_norm"]) == 0.0 and int(after.step) == 3
  assert int(after.consecutive_skips) == 0
  # The forward still ran: the step's metrics are the policy's (entropy of these rows).
  assert float(metrics["entropy"]) > 0 and float(metrics["loss"]) == 0.0

  old = rl_defaults(kl_coef=0.0, skip_without_signal=False)
  moved, metrics = make_update_step(CFG, old, optimizer, 1.0, 4)(
      jax.tree.map(jnp.asarray, state.replace(params=before[0], opt_state=before[1])), tied)
  assert float(metrics["grad_norm"]) == 0.0 and int(metrics["no_signal_updates"]) == 0
  change = max(float(jnp.max(jnp.abs(x - y)))
               for x, y in zip(jax.tree.leaves(moved.params), jax.tree.leaves(before[0])))
  assert change > 1e-4  # momentum alone, at lr 1e-2


def test_a_kl_term_is_signal():
  """With the KL in the loss, tied advantages still carry the KL's gradient: the step applies
  (no backward is left out: gradient_needs_advantages is False)."""
  rl = rl_defaults(kl_coef=0.1)
  state, batch, optimizer = _batch_and_state(rl)
  tied = batch._replace(advantages=jnp.zeros_like(batch.advantages))
  after, metrics = make_update_step(CFG, rl, optimizer, 1.0, 4)(state, tied)
  assert float(metrics["grad_norm"]) > 0 and int(metrics["no_signal_updates"]) == 0
  assert not _leaves_equal(after.opt_state, state.opt_state)  # moments and count moved
