"""Multi-turn episodes as token ids (grpo_jax/rollout/episodes/host.py), on a tiny random model and the
ChatML test tokenizer: the episode's ids are the sampler's own ids and the template's deltas,
never re-encoded text; the update's log-probs of the policy's tokens equal the sampler's; the
same key gives the same episodes whatever the tools' timing and the runner's concurrency."""

import random
import time

import jax
import numpy as np
import pytest

from grpo_jax.envs import StepResult
from grpo_jax.envs.chat import render
from grpo_jax.errors import ConfigError
from grpo_jax.rollout.episodes.host import sample_episodes
from grpo_jax.models.decoder import init_params
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rollout.sampler import Sampling
from tests.fixtures import tiny_model_config
from tests.hf_fixtures import save_tiny_tokenizer

AGAIN = {"role": "user", "content": "again"}


class Chatter:
  """Answers every assistant turn with "again" (after a random sleep when jitter) until
  max_turns; reward: the last turn's text length, to tell episodes apart."""
  tools = ()

  def __init__(self, max_turns=3, max_concurrency=8, jitter=False):
    self.max_turns, self.max_concurrency, self.jitter = max_turns, max_concurrency, jitter

  def reset(self, row, seed):
    return {"turn": 0}, [{"role": "user", "content": row}]

  def step(self, state, turn):
    if self.jitter:
      time.sleep(random.random() * 0.02)
    state = {"turn": state["turn"] + 1}
    done = state["turn"] >= self.max_turns
    return StepResult(state, [AGAIN], float(len(turn)) if done else None, done)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tok = save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
  cfg = tiny_model_config(vocab_size=len(tok))
  params = init_params(cfg, jax.random.key(0))
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  sampling = Sampling(cfg, max_new_tokens=6, eos_id=eos, pad_id=tok.pad_token_id)
  return tok, cfg, params, sampling


ROWS = ["What is 2 + 2?", "Name a colour.", "Count to three.", "Say hi."]


def _play(setup, env, n=40, rows=ROWS):
  tok, _, params, sampling = setup
  return sample_episodes(sampling, params, env, tok, rows, list(range(len(rows))),
                         jax.random.key(7), n)


def test_an_episode_is_the_samplers_ids_and_the_templates_deltas(setup):
  tok, _, params, sampling = setup
  rollout, info = _play(setup, Chatter(), n=80)
  delta = tok.encode("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
  for i, row in enumerate(ROWS):
    ids = rollout.completion_tokens[i][rollout.completion_mask[i]].tolist()
    actions = rollout.action_mask[i][rollout.completion_mask[i]].tolist()
    # The first turn's ids are what the sampler draws for this row, alone, at turn 0.
    prompt = tok.encode(render(tok, [{"role": "user", "content": row}],
                               add_generation_prompt=True))
    assert rollout.prompt_tokens[i][rollout.prompt_mask[i]].tolist() == prompt
    pad = 32 - rollout.prompt_tokens.shape[1]  # turn 0's width (bucketed to 32)
    first = sampling.with_stats(
        params, np.pad(rollout.prompt_tokens, ((0, 0), (pad, 0)),
                       constant_values=tok.pad_token_id),
        np.pad(rollout.prompt_mask, ((0, 0), (pad, 0))), jax.random.fold_in(jax.random.key(7),
                                                                            0))[0]
    n = int(first.completion_mask[i].sum())
    assert ids[:n] == first.completion_tokens[i, :n].tolist() and all(actions[:n])
    # Then the environment's delta, not the policy's; then the next turn's sampled ids.
    k = n + (0 if ids[n - 1] == sampling.eos_id else 1)  # a turn cut at 6 ids is closed
    assert ids[k:k + len(delta)] == delta and not any(actions[n:k + len(delta)])
    assert info[i] == dict(info[i], turns=3, truncated=False)
    # Three turns, two answers of the environment, each its delta once.
    text = tok.decode(prompt + ids, skip_special_tokens=False)
    assert text.count("<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n") == 2
    # The only tokens that are not the policy's: the two deltas, and an end-of-turn token
    # closing each turn that reached the sampler's 6 ids without one.
    ends = [j for j in range(len(ids))
            if actions[j] and (j + 1 == len(ids) or not actions[j + 1])]
    closed = sum(ids[j] != sampling.eos_id for j in ends)
    assert len(ids) - sum(actions) == 2 * len(delta) + closed and len(ends) == 3
    assert text.endswith("<|im_end|>")


def test_the_updates_logprobs_of_the_policys_tokens_equal_the_samplers(setup):
  _, cfg, params, _ = setup
  rollout, _ = _play(setup, Chatter())
  logp, _ = completion_logprobs(params, cfg, rollout.prompt_tokens, rollout.prompt_mask,
                                rollout.completion_tokens, rollout.completion_mask)
  actions = rollout.action_mask
  assert actions.sum() > 20 and (~actions & rollout.completion_mask).sum() > 20
  np.testing.assert_allclose(np.asarray(logp)[actions], rollout.logprobs[actions], atol=1e-5)


def test_the_same_key_gives_the_same_episodes_whatever_the_tool_timing(setup):
  calm, _ = _play(setup, Chatter(max_concurrency=1))
  jittery, _ = _play(setup, Chatter(max_concurrency=8, jitter=True))
  for a, b in zip(calm, jittery):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_episodes_tokens_do_not_depend_on_the_batch_it_shares(setup):
  """With episode ids, an episode draws the same tokens (its log-probs within 1e-5) alone, at
  another row, or among other episodes: its draws are (key, turn, id, position) alone."""
  tok, _, params, sampling = setup

  def play(rows, ids):
    rollout, _ = sample_episodes(sampling, params, Chatter(), tok, rows, list(ids),
                                 jax.random.key(7), 40, episode_ids=ids)
    return [(rollout.completion_tokens[i][rollout.completion_mask[i]].tolist(),
             rollout.logprobs[i][rollout.completion_mask[i]]) for i in range(len(rows))]
  together = play(ROWS, [10, 11, 12, 13])
  apart = play([ROWS[2], ROWS[0]], [12, 10]) + play([ROWS[3]], [13])
  for (ids_a, logp_a), (ids_b, logp_b) in zip([together[2], together[0], together[3]], apart):
    assert ids_a == ids_b
    np.testing.assert_allclose(logp_a, logp_b, atol=1e-5)
  # Without ids a row's index is its r: the same episode at another row draws other tokens.
  moved = sample_episodes(sampling, params, Chatter(), tok, [ROWS[1], ROWS[0]], [0, 1],
                          jax.random.key(7), 40)[0]
  assert (moved.completion_tokens[1][moved.completion_mask[1]].tolist() !=
          play([ROWS[0]], [0])[0][0])


def test_a_spent_budget_truncates_the_episode(setup):
  rollout, info = _play(setup, Chatter(max_turns=10), n=20)
  assert all(e["truncated"] for e in info) and rollout.truncated.all()
  assert rollout.completion_mask.sum(1).tolist() == [20] * len(ROWS)


def test_a_prompt_wider_than_the_prompt_width_is_one_sentence_before_any_turn(setup):
  tok, _, params, sampling = setup
  with pytest.raises(ConfigError, match=r"^an episode's first messages take \d+ tokens, more "
                     r"than task\.prompt_width=8; raise it\.$"):
    sample_episodes(sampling, params, Chatter(), tok, ROWS, [0] * 4, jax.random.key(7), 40,
                    prompt_width=8)


def test_every_episode_ends_through_the_environments_end_episode(setup):
  """Episodes cut by the token budget end without a step: the environment's end_episode (the
  OpenEnv adapter closes its environment there) is called once per episode, for every one."""
  ended = []

  class Ending(Chatter):
    def end_episode(self, state):
      ended.append(state["turn"])

  rollout, info = _play(setup, Ending(max_turns=3), n=8)  # a budget that cuts episodes
  assert len(ended) == len(ROWS) and any(i["truncated"] for i in info)
