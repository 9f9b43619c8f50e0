"""Reward shaping, process rewards, advantage dispatch and DAPO's dynamic sampling."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grpo_jax.builtins  # noqa: F401  every built-in estimator registered
from grpo_jax.defaults import rl_defaults
from grpo_jax.data.arithmetic import AdditionTask
from grpo_jax.rewards.exact_match import token_step_rewards
from grpo_jax.rl import advantages as adv_lib
from grpo_jax.rl.estimators import ESTIMATORS, make_estimator
from grpo_jax.rl.shaping import overlong_penalty
from grpo_jax.rollout.types import DecodeStats, Rollout
from grpo_jax.train.sources.collect import Samplers, collect
from grpo_jax.train.sources.experience_source import SourceSettings
from grpo_jax.train.run.seed_axis import SeedAxis


def test_overlong_penalty_matches_piecewise_definition():
  max_len, buffer, factor = 10, 4, 0.5
  lengths = np.arange(0, 13)
  expected = []
  for n in lengths:
    if n <= max_len - buffer:
      expected.append(0.0)
    elif n <= max_len:
      expected.append(((max_len - buffer) - n) / buffer * factor)
    else:
      expected.append(-factor)
  got = overlong_penalty(jnp.asarray(lengths), max_len, buffer, factor)
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-7)
  assert float(got[10]) == pytest.approx(-0.5)  # a completion at the limit gets the full penalty


def test_token_step_rewards_score_each_token_against_the_target():
  completion = np.array([[5, 6, 2, 0], [5, 7, 7, 2]])
  cmask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
  target = np.array([[5, 6, 2, 0], [5, 6, 2, 0]])
  tmask = np.array([[1, 1, 1, 0], [1, 1, 1, 0]], bool)
  rewards, end, step_mask = token_step_rewards(completion, cmask, target, tmask)
  np.testing.assert_array_equal(np.asarray(rewards), [[1, 1, 1, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(end), [[0, 1, 2, 3]] * 2)
  np.testing.assert_array_equal(np.asarray(step_mask), cmask)


def test_every_estimator_dispatches_to_its_formula():
  rng = np.random.default_rng(0)
  group, b, n = 4, 8, 5
  mask = jnp.asarray(np.arange(n)[None] < rng.integers(1, n + 1, b)[:, None])
  rewards = jnp.asarray(rng.integers(0, 2, b).astype(np.float32))
  token_rewards = adv_lib.place_reward_on_last_token(rewards, mask)
  values = jnp.asarray(rng.normal(size=(b, n)).astype(np.float32))
  extras = {"greedy_rewards": jnp.asarray(rng.random(b).astype(np.float32)),
            "step_rewards": (token_rewards, jnp.tile(jnp.arange(n), (b, 1)), mask)}
  names = ESTIMATORS.names()
  seen = set()
  for name in names:
    rl = rl_defaults(advantage=name)
    adv, returns = make_estimator(rl)(group, token_rewards, mask, values, extras)
    assert adv.shape == (b, n) and returns.shape == (b, n)
    assert np.all(np.asarray(adv)[~np.asarray(mask)] == 0)
    seen.add(np.asarray(adv).round(5).tobytes())
  assert len(seen) == len(names)  # nine estimators, nine different answers
  grpo, _ = make_estimator(rl_defaults())(group, token_rewards, mask, values, extras)
  expected = adv_lib.broadcast_to_tokens(
      adv_lib.group_normalized_advantages(rewards, group, 1e-6), mask)
  np.testing.assert_array_equal(np.asarray(grpo), np.asarray(expected))


class _ScriptedSampler:
  """Answers right on some groups only: in round k, group g is half right iff (g + k) % 3 == 0,
  otherwise all wrong, so dynamic sampling must draw extra rounds."""

  def __init__(self, task, group):
    self.task, self.group, self.round = task, group, 0

  def __call__(self, params, prompt_tokens, prompt_mask, key):
    """Prompts (num_prompts, P) -> num_prompts x G rows, as the run's sampler."""
    tok = self.task.tokenizer
    prompt_tokens, prompt_mask = (np.repeat(x, self.group, 0) for x in (prompt_tokens,
                                                                          prompt_mask))
    rows = []
    for i, (tokens, mask) in enumerate(zip(prompt_tokens, prompt_mask)):
      a, b = tok.decode(tokens[mask]).rstrip("=").split("+")
      right = ((i // self.group + self.round) % 3 == 0) and (i % 2 == 0)
      answer = self.task.encode(np.array([[int(a), int(b)]]),
                                np.array([int(a) + int(b) + (0 if right else 1)]))
      rows.append((answer.target_tokens[0], answer.target_mask[0]))
    self.round += 1
    tokens = np.stack([r[0] for r in rows])
    mask = np.stack([r[1] for r in rows])
    return (Rollout(prompt_tokens, prompt_mask, tokens, mask, np.zeros(mask.shape, np.float32),
                    np.zeros(len(rows), bool), mask), DecodeStats(np.int32(mask.size)))


@pytest.mark.parametrize("max_extra", [4, 1])
def test_dynamic_sampling_keeps_only_groups_with_a_reward_spread(max_extra):
  task = AdditionTask(2, 100, 4, True, True)
  settings = SourceSettings("host", num_prompts=6, group_size=4, dynamic_sampling=True,
                            max_extra_rollouts=max_extra)
  sampler = _ScriptedSampler(task, 4)
  (out,) = collect(None, [12], [jax.random.key(0)], task, settings,
                   Samplers(sample=sampler, greedy=None), SeedAxis((0,)))
  rewards = np.asarray(out.inputs.rewards).reshape(6, 4)
  spread = rewards.max(1) > rewards.min(1)
  # Each round yields 2 of 6 groups with a spread: 3 rounds fill the batch.
  expected_rounds = 3 if max_extra >= 2 else 2
  assert out.sampling_rounds == expected_rounds
  assert int(out.inputs.prompts_consumed) == 6 * expected_rounds
  assert spread.sum() == min(6, 2 * expected_rounds) == 6 - out.groups_without_spread
  assert np.all(spread[:6 - out.groups_without_spread])  # kept groups first, fillers after
  assert np.all(rewards[spread] .sum(1) == 2)  # half right, as scripted
  assert out.rollout.completion_tokens.shape == (24, 4)


class _NanSteps:
  """The addition task whose step rewards are NaN on the completion of row 2."""

  def __init__(self, task):
    self.task = task

  def __getattr__(self, name):
    return getattr(self.task, name)

  def step_rewards(self, batch, tokens, mask, group_size):
    rewards, end, step_mask = self.task.step_rewards(batch, tokens, mask, group_size)
    rewards = np.array(rewards, np.float32)
    rewards[2, 0] = np.nan
    return rewards, end, step_mask


@pytest.mark.parametrize("mode", ["raise", "zero"])
def test_non_finite_step_rewards_stop_the_run_or_score_zero(mode):
  from grpo_jax.train.sources.collect import score_round  # noqa: PLC0415
  from grpo_jax.errors import RewardError  # noqa: PLC0415
  task = AdditionTask(2, 100, 4, True, True)
  prompts = task.encode(np.array([[7, 68], [12, 30]]))
  answer = lambda g: np.repeat(task.encode(np.array([g]))  # noqa: E731
                               .target_tokens, 2, 0)
  tokens = np.concatenate([answer([7, 68]), answer([12, 30])])
  mask = tokens != task.pad_id
  rollout = Rollout(np.repeat(prompts.prompt_tokens, 2, 0), np.repeat(prompts.prompt_mask, 2, 0),
                    tokens, mask, np.zeros(mask.shape, np.float32), np.zeros(4, bool),
                    mask)
  if mode == "raise":
    with pytest.raises(RewardError, match="step rewards are not finite for 1 completion"):
      score_round(_NanSteps(task), prompts, rollout, None, 2, mode, needs=("step_rewards",))
    return
  rewards, extras, errors, _, _ = score_round(_NanSteps(task), prompts, rollout, None, 2, mode,
                                        needs=("step_rewards",))
  np.testing.assert_array_equal(rewards, [1, 1, 0, 1])  # every answer right, row 2 zeroed
  assert errors == 1 and np.all(extras["step_rewards"][0][2] == 0)
  assert np.isfinite(extras["step_rewards"][0]).all() and extras["step_rewards"][0][0].sum() == 4


def test_rounds_of_other_prompt_widths_assemble_with_their_moe_routes():
  """Dynamic sampling's rounds cut their prompts to their own widths; assembled, the prompts
  are left-padded to the widest. An MoE rollout's routes (B, P + N, layers, k) were not, and
  the concatenation failed mid-run (numpy's "all the input array dimensions ... must match")."""
  from grpo_jax.train.sources.collect import _assemble  # noqa: PLC0415

  def group(width, value, n=3, g=2):
    routes = np.full((g, width + n, 2, 2), value, np.int32)
    return (Rollout(np.full((g, width), 7, np.int32), np.ones((g, width), bool),
                    np.ones((g, n), np.int32), np.ones((g, n), bool), np.zeros((g, n), np.float32),
                    np.zeros(g, bool), np.ones((g, n), bool), routes=routes),
            np.array([0.0, 1.0]), {}, {}, None)

  rollout = _assemble([group(4, 1), group(6, 2)], [], 2, 4, 2, 0).rollout
  assert rollout.prompt_tokens.shape == (4, 6) and rollout.routes.shape == (4, 9, 2, 2)
  np.testing.assert_array_equal(rollout.routes[:2, :2], 0)  # the new positions: never run
  np.testing.assert_array_equal(rollout.routes[:2, 2:], 1)
  np.testing.assert_array_equal(rollout.routes[2:], 2)
  np.testing.assert_array_equal(rollout.prompt_mask[:2, :2], False)
