"""KV-cache continuation of multi-turn episodes (grpo_jax/rollout/continuation.py,
env.kv_continuation): on a tiny random float32 model, the continued episodes are the
re-prefilled ones, id for id (greedy and sampled with the same keys), their log-probs within
1e-5, with rows of different prompt lengths, different environment answers and different ends
(per-row cache offsets; one spends its budget), and an extension split over several passes."""

import jax
import numpy as np
import pytest

from grpo_jax.envs import StepResult
from grpo_jax.rollout.episodes.host import _left_pad, sample_episodes
from grpo_jax.models.decoder import init_params
from grpo_jax.rollout.slot_continuation import SlotTurns
from grpo_jax.rollout.sampler import Sampling
from tests.fixtures import tiny_model_config
from tests.hf_fixtures import save_tiny_tokenizer

ROWS = ["What is 2 + 2?", "Hi.", "Count to three, slowly please.", "Say hi."]


class Uneven:
  """Row-dependent episodes: row i ends after 1 + i % 3 turns, and the user's answers have
  row- and turn-dependent lengths, so the rows' caches sit at different offsets."""
  tools = ()
  max_turns, max_concurrency = 3, 4

  def reset(self, row, seed):
    return {"turn": 0, "ends": 1 + seed % 3, "seed": seed}, [{"role": "user", "content": row}]

  def step(self, state, turn):
    state = dict(state, turn=state["turn"] + 1)
    done = state["turn"] >= state["ends"]
    answer = {"role": "user", "content": "again " * (1 + (state["seed"] + state["turn"]) % 4)}
    return StepResult(state, [answer], float(len(turn)) if done else None, done)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tok = save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
  cfg = tiny_model_config(vocab_size=len(tok))
  params = init_params(cfg, jax.random.key(0))
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  sampling = Sampling(cfg, max_new_tokens=6, eos_id=eos, pad_id=tok.pad_token_id)
  return tok, params, sampling


def _play(setup, sampling, continued: bool, n=60):
  """The episodes of ROWS; every re-prefilled turn at one input width (96: one compiled
  sampler), the continued ones at their prompts' and the budget's."""
  tok, params, _ = setup
  return sample_episodes(sampling, params, Uneven(), tok, ROWS, list(range(len(ROWS))),
                         jax.random.key(3), n, width_bucket=96, prompt_width=32,
                         kv_continuation=continued)


def _assert_same_episodes(a, b):
  (ra, ia), (rb, ib) = a, b
  for name in ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask",
               "action_mask", "truncated"):
    np.testing.assert_array_equal(getattr(ra, name), getattr(rb, name), err_msg=name)
  np.testing.assert_allclose(ra.logprobs, rb.logprobs, atol=1e-5)
  assert [(i["reward"], i["turns"], i["truncated"]) for i in ia] == [
      (i["reward"], i["turns"], i["truncated"]) for i in ib]


def test_greedy_continued_episodes_are_the_reprefilled_ones(setup):
  greedy = setup[2].greedy()
  continued, reprefilled = _play(setup, greedy, True), _play(setup, greedy, False)
  _assert_same_episodes(continued, reprefilled)
  rollout, infos = continued
  assert len({i["turns"] for i in infos}) >= 2  # rows end at different turns
  assert 0 < sum(i["truncated"] for i in infos) < len(ROWS)  # one spends its budget
  assert (~rollout.action_mask & rollout.completion_mask).sum() > 10  # environment ids


def test_sampled_continued_episodes_are_the_reprefilled_ones_at_the_same_keys(setup):
  sampled = setup[2]  # temperature 1
  _assert_same_episodes(_play(setup, sampled, True), _play(setup, sampled, False))


@pytest.mark.parametrize("weight_dtype", ["", "int8"])  # (rollout.weight_dtype: both read it)
def test_an_extension_over_several_passes_gives_the_samplers_first_turn(setup, weight_dtype):
  """Prompts of different lengths written 4 ids per pass (several passes, a different count
  in each row's last one): the first turn is the sampler's on the left-padded prompts."""
  tok, params, sampling = setup
  sampling = sampling.quantized(weight_dtype)
  prompts = [tok.encode(r) for r in ROWS]
  rows = len(ROWS)
  turns = SlotTurns(sampling, params, rows, rows, 32, 20, chunk=4)
  key = jax.random.key(5)
  tokens, mask, logprobs = turns(list(range(rows)), prompts, key, [0] * rows, [6] * rows)
  padded = _left_pad(prompts, 32, tok.pad_token_id)
  want = sampling.with_stats(params, *padded, jax.random.fold_in(key, 0))[0]  # turn 0
  np.testing.assert_array_equal(mask, want.completion_mask)
  np.testing.assert_array_equal(tokens, want.completion_tokens)
  np.testing.assert_allclose(logprobs, want.logprobs, atol=1e-5)
  assert turns.cached.tolist() == [len(p) + int(m.sum()) - 1 for p, m in zip(prompts, mask)]


def test_the_config_switch_is_off_by_default_and_reaches_the_task():
  """env.kv_continuation: off by default (continued log-probs differ from the re-prefilled
  ones by float rounding, so existing runs stay bit-identical); the task carries it to the
  episodes source and the evaluation."""
  from configs import grpo_calculator_tiny
  from grpo_jax.data.env_task import EnvTask
  c = grpo_calculator_tiny.get_config()
  assert c.env.kv_continuation is False
  c.env.kv_continuation = True
  task = EnvTask.from_config(c, tokenizer="char", test_size=4, prompt_width=56)
  assert task.kv_continuation is True
