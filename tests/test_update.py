"""The assembled update: micro-batching is exact, critics, KL controller, reference refresh,
and the non-finite guard."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import optax
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.models.value_head import init_value_params
from grpo_jax.rl.aggregation import LOSS_AGGREGATIONS
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.learner.experience import (RewardInputs, make_prepare_batch,
                                       reuses_current_logprobs)
from grpo_jax.train.learner.state import create_train_state, end_of_step, make_optimizer
from grpo_jax.train.learner.update import make_update_step
from tests.fixtures import perturbed_params, tiny_model_config

CFG = tiny_model_config(vocab_size=16)
OPTIM = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=1, weight_decay=0.0,
                                       b1=0.9, b2=0.99, max_grad_norm=1e9))
PROMPTS = np.repeat(np.array([[1, 5, 6], [1, 9, 4], [0, 1, 3], [1, 12, 11]], np.int32), 4, 0)


def _batch_and_state(rl, seed=0):
  params = perturbed_params(CFG, seed)
  value_params = init_value_params(rl.value_head, CFG, params, None)
  if value_params is not None:  # a non-trivial head so values matter
    value_params["head"]["kernel"] = jax.random.normal(jax.random.key(5), (CFG.hidden_size, 1))
  optimizer = make_optimizer(OPTIM, 10)
  state = create_train_state(params, optimizer, jax.random.key(1), value_params, rl.kl_coef)
  state = state.replace(ref_params=perturbed_params(CFG, seed + 1))  # a reference that differs
  rollout = generate(params, PROMPTS, PROMPTS != 0, jax.random.key(seed), model_cfg=CFG,
                     max_new_tokens=5, temperature=1.0, eos_id=2, pad_id=0)
  rewards = np.asarray(jax.random.uniform(jax.random.key(9), (len(PROMPTS),)))
  inputs = RewardInputs(jnp.asarray(rewards, jnp.float32), {}, jnp.int32(0))
  prepare = jax.jit(make_prepare_batch(CFG, rl, 4, 1.0, 5))
  batch, _ = prepare(state, rollout, inputs)
  return state, batch, optimizer


@pytest.mark.parametrize("mode,value_head", [(m, "none") for m in LOSS_AGGREGATIONS] +
                         [("seq-mean-token-mean", "shared")])
def test_micro_batches_give_the_full_batch_update(mode, value_head):
  results = []
  for micro in (1, 4):
    rl = rl_defaults(loss_aggregation=mode, num_micro_batches=micro, value_head=value_head,
                     advantage="gae" if value_head != "none" else "grpo", entropy_coef=0.01,
                     num_minibatches=2, num_iterations=1)
    state, batch, optimizer = _batch_and_state(rl)
    new_state, metrics = make_update_step(CFG, rl, optimizer, 1.0)(state, batch)
    results.append((new_state, metrics))
  (a, ma), (b, mb) = results
  for x, y in zip(jax.tree.leaves((a.params, a.value_params)),
                  jax.tree.leaves((b.params, b.value_params))):
    # Adam's first step moves each element by about lr * g / |g| (lr = 1e-2), so summation-order
    # rounding in a gradient element near Adam's eps shows up enlarged (measured: one element
    # of 1536 2.6e-6 apart); a wrong micro-batch normaliser moves elements by ~lr.
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)
  for key in ("loss", "pg_loss", "kl", "clip_frac", "entropy"):
    # float32 sums in another order: rel 1e-5 (measured 1.05e-6 on a loss of 10.9)
    assert float(ma[key]) == pytest.approx(float(mb[key]), rel=1e-5, abs=1e-6), key
  moved = max(float(jnp.max(jnp.abs(x - y))) for x, y in
              zip(jax.tree.leaves(a.params), jax.tree.leaves(_batch_and_state(rl)[0].params)))
  assert moved > 1e-4  # the update did something


@pytest.mark.parametrize("value_head", ["shared", "separate"])
def test_critic_values_are_frozen_at_rollout_and_then_fitted(value_head):
  rl = rl_defaults(advantage="gae", value_head=value_head, value_coef=1.0, kl_coef=0.0)
  state, batch, optimizer = _batch_and_state(rl)
  update = make_update_step(CFG, rl, optimizer, 1.0)
  old_values = np.asarray(batch.old_values)
  mask = np.asarray(batch.completion_mask)
  assert np.abs(old_values[mask]).max() > 0 and np.all(old_values[~mask] == 0)
  losses = []
  for _ in range(5):
    state, metrics = update(state, batch)
    losses.append(float(metrics["value_loss"]))
  np.testing.assert_array_equal(np.asarray(batch.old_values), old_values)  # never re-read
  assert losses[-1] < losses[0]
  if value_head == "separate":
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                                         state.value_params["backbone"], state.params))
    assert max(moved) > 0  # the critic's backbone is its own


def test_non_finite_loss_leaves_state_unchanged_and_is_counted():
  rl = rl_defaults()
  state, batch, optimizer = _batch_and_state(rl)
  bad = batch._replace(advantages=batch.advantages.at[0, 0].set(jnp.nan))
  new_state, metrics = make_update_step(CFG, rl, optimizer, 1.0)(state, bad)
  for x, y in zip(jax.tree.leaves((state.params, state.opt_state)),
                  jax.tree.leaves((new_state.params, new_state.opt_state))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert int(metrics["skipped_updates"]) == 1 and int(new_state.step) == 1


def test_adaptive_kl_and_reference_refresh():
  rl = rl_defaults(adaptive_kl=True, kl_coef=0.1, kl_target=0.1, kl_horizon=1000.0,
                   ref_update_every=2, ref_mix=0.25)
  state, _, _ = _batch_and_state(rl)
  state = state.replace(step=jnp.int32(1))
  after = end_of_step(state, rl, rollout_kl=jnp.float32(0.5), batch_size=16)
  # KL/target - 1 = 4, clipped to 0.2: beta * (1 + 0.2 * 16 / 1000)
  assert float(after.kl_coef) == pytest.approx(0.1 * (1 + 0.2 * 16 / 1000), rel=1e-6)
  for r, r0 in zip(jax.tree.leaves(after.ref_params), jax.tree.leaves(state.ref_params)):
    np.testing.assert_array_equal(np.asarray(r), np.asarray(r0))  # step 1: no refresh
  lower = end_of_step(state, rl, rollout_kl=jnp.float32(0.09), batch_size=16)
  assert float(lower.kl_coef) == pytest.approx(0.1 * (1 - 0.1 * 16 / 1000), rel=1e-6)
  at_two = end_of_step(state.replace(step=jnp.int32(2)), rl, jnp.float32(0.1), 16)
  for r, p, r0 in zip(jax.tree.leaves(at_two.ref_params), jax.tree.leaves(state.params),
                      jax.tree.leaves(state.ref_params)):
    np.testing.assert_allclose(np.asarray(r), 0.25 * np.asarray(p) + 0.75 * np.asarray(r0),
                               atol=1e-6)


# Where reuses_current_logprobs applies, each with a different part of what needs old log-probs.
_REUSE_CASES = {
    "grpo_kl_in_loss": dict(),
    "tis_entropy_mask_truncated": dict(tis_cap=1.5, entropy_coef=0.01, mask_truncated=True),
    "gspo_no_kl": dict(loss="gspo", kl_coef=0.0, loss_aggregation="seq-mean-token-mean"),
    "separate_critic_gae_micro": dict(advantage="gae", value_head="separate", tis_cap=2.0,
                                      num_micro_batches=4),
    "adaptive_kl_ref_refresh": dict(adaptive_kl=True, kl_coef=0.1, ref_update_every=1,
                                    ref_mix=0.5),
}


def _two_steps(rl):
  """prepare + update + end_of_step twice, from a rollout of a different (sampler) policy, so
  the sampler/trainer log-prob gap and the TIS weights are far from trivial.

  Plain SGD, so that a params difference is the learning rate times a gradient difference:
  Adam divides by sqrt(v) + eps, which turns float32 rounding in a gradient entry near 1e-8
  (there are such entries here) into a step of up to the learning rate, in any two programs
  that compute the same gradient differently."""
  params = perturbed_params(CFG, 0)
  value_params = init_value_params(rl.value_head, CFG, params, None)
  optimizer = optax.sgd(0.1)
  state = create_train_state(params, optimizer, jax.random.key(1), value_params, rl.kl_coef)
  state = state.replace(ref_params=perturbed_params(CFG, 1))
  rollout = generate(perturbed_params(CFG, 7), PROMPTS, PROMPTS != 0, jax.random.key(0),
                     model_cfg=CFG, max_new_tokens=5, temperature=1.0, eos_id=2, pad_id=0)
  rewards = np.asarray(jax.random.uniform(jax.random.key(9), (len(PROMPTS),)))
  inputs = RewardInputs(jnp.asarray(rewards, jnp.float32), {}, jnp.int32(0))
  prepare = jax.jit(make_prepare_batch(CFG, rl, 4, 1.0, 5))
  update = make_update_step(CFG, rl, optimizer, 1.0)
  history = []
  for _ in range(2):
    batch, prep_metrics = prepare(state, rollout, inputs)
    state, metrics = update(state, batch)
    merged = {**metrics, **prep_metrics}
    state = end_of_step(state, rl, merged["rollout_kl"], len(PROMPTS))
    history.append((batch, set(prep_metrics), {k: float(v) for k, v in merged.items()}))
  return state, history


@pytest.mark.parametrize("case", sorted(_REUSE_CASES))
def test_reusing_current_logprobs_equals_recomputing_them(case):
  reuse_rl = rl_defaults(**_REUSE_CASES[case])
  recompute_rl = rl_defaults(**_REUSE_CASES[case], reuse_old_logprobs=False)
  assert reuses_current_logprobs(reuse_rl) and not reuses_current_logprobs(recompute_rl)
  got_state, got = _two_steps(reuse_rl)
  want_state, want = _two_steps(recompute_rl)
  # The forward pass really is skipped: preparation leaves the old log-probs (and the metrics
  # that need them) to the update.
  assert got[0][0].old_logprobs is None
  assert np.any(np.asarray(want[0][0].old_logprobs))
  assert got[0][1] == want[0][1] - {"rollout_kl", "sampler_logprob_gap"}
  for x, y in zip(jax.tree.leaves((got_state.params, got_state.value_params, got_state.kl_coef,
                                   got_state.ref_params)),
                  jax.tree.leaves((want_state.params, want_state.value_params,
                                   want_state.kl_coef, want_state.ref_params))):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-6)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree.leaves(got_state.params), jax.tree.leaves(perturbed_params(CFG, 0))))
  assert moved > 1e-3  # two real updates
  for (_, _, g), (_, _, w) in zip(got, want):
    assert set(g) == set(w)
    for key in ("loss", "pg_loss", "kl", "rollout_kl", "sampler_logprob_gap", "clip_frac",
                "ratio", "entropy", "advantage_abs_mean") + (
                    ("value_loss", "value_mean") if "value_loss" in w else ()):
      assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), key
  assert want[0][2]["sampler_logprob_gap"] > 0.1  # the sampler really is another policy
  if reuse_rl.kl_coef > 0:
    assert want[1][2]["rollout_kl"] > 1e-3


@pytest.mark.parametrize("overrides", [
    dict(num_iterations=2), dict(num_minibatches=2), dict(kl_in="reward"),
    dict(value_head="shared", advantage="gae")])
def test_old_logprobs_are_recomputed_where_they_differ_or_are_needed_early(overrides):
  rl = rl_defaults(**overrides)
  assert not reuses_current_logprobs(rl)
  state, batch, _ = _batch_and_state(rl)
  assert np.any(np.asarray(batch.old_logprobs))
  # kl_in == "reward" with kl_coef == 0 needs no KL before the update: reused again.
  assert reuses_current_logprobs(rl_defaults(kl_in="reward", kl_coef=0.0))


def test_the_loss_mask_is_the_action_mask():
  """Tokens a source marks as not the policy's (Rollout.action_mask False: a tool's output in a
  multi-turn episode) carry no loss, while still conditioning the rest: the batch's loss mask
  is the action mask (less truncated rows under rl.mask_truncated)."""
  rl = rl_defaults(mask_truncated=True)
  params = perturbed_params(CFG, 0)
  state = create_train_state(params, make_optimizer(OPTIM, 10), jax.random.key(1), None,
                             rl.kl_coef)
  rollout = generate(params, PROMPTS, PROMPTS != 0, jax.random.key(0), model_cfg=CFG,
                     max_new_tokens=5, temperature=1.0, eos_id=2, pad_id=0)
  inserted = np.zeros(rollout.completion_mask.shape, bool)
  inserted[:, 1:3] = True  # "tool output" at completion positions 1-2 of every row
  rollout = rollout._replace(action_mask=rollout.completion_mask & ~inserted)
  inputs = RewardInputs(jnp.linspace(0, 1, len(PROMPTS), dtype=jnp.float32), {}, jnp.int32(0))
  batch, _ = jax.jit(make_prepare_batch(CFG, rl, 4, 1.0, 5))(state, rollout, inputs)
  want = (np.asarray(rollout.completion_mask) & ~inserted
          & ~np.asarray(rollout.truncated)[:, None])
  np.testing.assert_array_equal(np.asarray(batch.loss_mask), want)
  np.testing.assert_array_equal(np.asarray(batch.completion_mask),
                                np.asarray(rollout.completion_mask))
  assert want.sum() > 0 and (np.asarray(rollout.completion_mask) & inserted).sum() > 0


@pytest.mark.parametrize("name", ["constant", "linear", "cosine"])
def test_lr_schedules_warm_up_then_hold_or_decay_to_the_final_fraction(name):
  """optim.schedule against a NumPy reference: linear warm-up over 10 updates to 5e-4, then
  constant, or down to 0.1 x the peak at update 100, linearly or along a half cosine."""
  from grpo_jax.rl.lr_schedules import LR_SCHEDULES  # noqa: PLC0415
  peak, warm, total, final = 5e-4, 10, 100, 5e-5
  t = np.arange(0, 120)
  frac = np.clip((t - warm) / (total - warm), 0, 1)
  after = {"constant": np.full_like(frac, peak),
           "linear": peak + (final - peak) * frac,
           "cosine": final + (peak - final) * 0.5 * (1 + np.cos(np.pi * frac))}[name]
  want = np.where(t < warm, peak * t / warm, after)
  got = np.array([float(LR_SCHEDULES[name](peak, warm, total, final)(i)) for i in t])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-10)


def test_no_warm_up_gives_the_peak_rate_from_the_first_update(caplog):
  """optim.warmup_steps 0: every schedule starts at the peak (without optax's note on a warm-up
  of no steps), and the first AdamW update moves each parameter by the full rate (it was 0)."""
  from grpo_jax.rl.lr_schedules import LR_SCHEDULES  # noqa: PLC0415
  with caplog.at_level(logging.DEBUG):
    for name, make in LR_SCHEDULES.items():
      assert float(make(1e-3, 0, 10, 1e-4)(0)) == pytest.approx(1e-3, rel=1e-6), name
  assert "non-positive" not in caplog.text
  for name in LR_SCHEDULES:
    optimizer = make_optimizer(ml_collections.ConfigDict(dict(
        OPTIM, warmup_steps=0, schedule=name, final_lr_fraction=0.1)), 10)
    params = {"w": jnp.ones(3)}
    updates, _ = optimizer.update({"w": jnp.ones(3)}, optimizer.init(params), params)
    np.testing.assert_allclose(updates["w"], -OPTIM.learning_rate, rtol=1e-5)
