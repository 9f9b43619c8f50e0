"""Shared-prompt forward passes (rl.shared_prompt_forward): each prompt runs once through the
teacher-forced passes for its G completions. The same log-probs, entropies, hidden states and
gradients as the per-row forward (float32 rounding apart), the same RL step, minibatches of
whole groups, and a clear error where a micro-batch would cut a group."""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.config import ConfigError, validate
from grpo_jax.defaults import rl_defaults
from grpo_jax.models.scoring import completion_scores
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.learner.experience import RewardInputs, make_prepare_batch
from grpo_jax.train.stages.rl import train
from grpo_jax.train.learner.state import create_train_state, end_of_step
from grpo_jax.train.learner.update import make_update_step, minibatch_order
from tests.fixtures import perturbed_params, small_tiny_config, tiny_model_config

G = 3
PROMPTS = np.array([[0, 0, 3, 7, 9], [5, 6, 7, 8, 9], [0, 0, 0, 1, 4]], np.int32)


def _seqs():
  rng = np.random.default_rng(0)
  prompts = np.repeat(PROMPTS, G, 0)
  completions = rng.integers(3, 19, (len(prompts), 6)).astype(np.int32)  # vocabulary 19
  mask = np.ones_like(completions, bool)
  mask[1, 3:] = False  # an early end, and a row with one real token
  mask[5, 1:] = False
  return types.SimpleNamespace(prompt_tokens=prompts, prompt_mask=prompts != 0,
                               completion_tokens=completions, completion_mask=mask)


@pytest.mark.parametrize("remat,chunk", [("none", 0), ("full", 0), ("full", 4)])
def test_shared_prompt_scores_and_gradients_equal_the_per_row_forward(remat, chunk):
  cfg = dataclasses.replace(tiny_model_config(), remat=remat, logits_chunk=chunk)
  params = perturbed_params(tiny_model_config(), seed=3)
  seqs = _seqs()
  mask = seqs.completion_mask

  def loss(p, group):
    logp, entropy, hidden = completion_scores(p, cfg, seqs, 0.8, True, group)
    return jnp.sum(jnp.where(mask, 0.7 * logp + 0.1 * entropy, 0.0)), (logp, entropy, hidden)

  grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (want_loss, want), want_grads = grad(params, 1)
  (got_loss, got), got_grads = grad(params, G)
  assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
  for g, w in zip(got, want):  # log-probs (about -3), entropies (about 2.5), hidden (about 1)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-5)
  worst = max(float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
              for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)))
  assert worst < 1e-5  # measured 2-3e-6 relative to each leaf's largest entry


def test_minibatches_are_whole_groups_and_every_row_is_drawn_once_per_pass():
  order = np.asarray(minibatch_order(jax.random.key(0), 24, 2, 3, 4))
  assert order.shape == (6, 8)
  for one_pass in (order[:3], order[3:]):
    assert sorted(one_pass.reshape(-1)) == list(range(24))
  runs = order.reshape(-1, 4)
  assert np.all(runs % 4 == np.arange(4)) and np.all(runs // 4 == runs[:, :1] // 4)
  assert not np.array_equal(order[:3], order[3:])  # each pass its own permutation
  np.testing.assert_array_equal(minibatch_order(jax.random.key(0), 8, 1, 1, 4), [range(8)])
  flat = np.asarray(minibatch_order(jax.random.key(0), 24, 1, 3))  # rows, as before
  np.testing.assert_array_equal(
      flat.reshape(-1), np.asarray(jax.random.permutation(jax.random.fold_in(
          jax.random.key(0), 0), 24)))


CFG = tiny_model_config(vocab_size=16)
STEP_PROMPTS = np.repeat(np.array([[1, 5, 6], [1, 9, 4], [0, 1, 3], [1, 12, 11]], np.int32), 4, 0)


def _two_steps(rl):
  """prepare + update + end_of_step twice with plain SGD (a params difference is then the
  learning rate times a gradient difference; see tests/test_update.py)."""
  params = perturbed_params(CFG, 0)
  optimizer = optax.sgd(0.1)
  state = create_train_state(params, optimizer, jax.random.key(1), None, rl.kl_coef)
  state = state.replace(ref_params=perturbed_params(CFG, 1))
  rollout = generate(perturbed_params(CFG, 7), STEP_PROMPTS, STEP_PROMPTS != 0,
                     jax.random.key(0), model_cfg=CFG, max_new_tokens=5, temperature=1.0,
                     eos_id=2, pad_id=0)
  rewards = jax.random.uniform(jax.random.key(9), (len(STEP_PROMPTS),))
  inputs = RewardInputs(rewards, {}, jnp.int32(0))
  prepare = jax.jit(make_prepare_batch(CFG, rl, 4, 1.0, 5))
  update = make_update_step(CFG, rl, optimizer, 1.0, 4)
  history = []
  for _ in range(2):
    batch, prep_metrics = prepare(state, rollout, inputs)
    state, metrics = update(state, batch)
    merged = {**metrics, **prep_metrics}
    state = end_of_step(state, rl, merged["rollout_kl"], len(STEP_PROMPTS))
    history.append({k: float(v) for k, v in merged.items()})
  return state, history


@pytest.mark.parametrize("overrides", [
    dict(),  # old log-probs reused from the update's own pass; the reference pass shared
    dict(reuse_old_logprobs=False, num_micro_batches=2),  # old log-probs by a pass of their own
    dict(num_iterations=2, reuse_old_logprobs=False, kl_coef=0.0),  # mu = 2, no reference
])
def test_the_rl_step_with_shared_prompts_equals_the_per_row_step(overrides):
  overrides = {"kl_coef": 0.04, **overrides}
  got_state, got = _two_steps(rl_defaults(**overrides, shared_prompt_forward=True))
  want_state, want = _two_steps(rl_defaults(**overrides))
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree.leaves(want_state.params), jax.tree.leaves(perturbed_params(CFG, 0))))
  assert moved > 1e-3  # two real updates
  for g, w in zip(jax.tree.leaves(got_state.params), jax.tree.leaves(want_state.params)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-6)
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for key in ("loss", "pg_loss", "kl", "rollout_kl", "clip_frac", "ratio", "entropy"):
      assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), key


def test_a_micro_batch_that_cuts_a_group_is_one_sentence():
  from configs import grpo_tiny  # noqa: PLC0415
  config = grpo_tiny.get_config()  # 16 prompts x 8 completions
  config.rl.shared_prompt_forward = True
  config.rl.num_micro_batches = 32  # micro-batches of 4 rows: half a group
  with pytest.raises(ConfigError, match=r"^rl.shared_prompt_forward runs each prompt once for "
                     r"its 8 completions, but a micro-batch holds 4 completions;") as err:
    validate(config)
  assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")
  config.rl.num_micro_batches = 16  # 8 rows: one group each
  validate(config)


def test_a_run_with_shared_prompts_goes_through_the_loop(tmp_path):
  """The tiny run's first step (the same rollout, one minibatch) has the same loss and KL with
  the option on; the next step runs too."""
  records = {}
  for shared in (False, True):
    config = small_tiny_config(steps=2, num_minibatches=1)
    config.model.update(remat="full")
    config.rl.shared_prompt_forward = shared
    train(config, str(tmp_path / str(shared)), log=lambda *_: None)
    with open(tmp_path / str(shared) / "metrics.jsonl") as f:
      records[shared] = [json.loads(line) for line in f]
  assert [r["step"] for r in records[True]] == [0, 1, 2]
  first = [r for r in records[True] if "loss" in r][0]
  want = [r for r in records[False] if "loss" in r][0]
  for key in ("loss", "kl", "entropy", "reward_mean"):
    assert first[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
