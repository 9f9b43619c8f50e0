"""KV-cache continuation inside the pure-JAX episode loop (rollout/episodes/pure_jax.py,
play_episodes(..., kv_continuation=True)) and its early stop. On a tiny random float32 model
whose episodes last 1 to 3 turns (a calculator env that answers every turn before the row's
last with the product, as a tool would: `Persistent`, its JAX step `persistent_step`), with
seeds vmapped as the fused source does:

(a) the fused continued episodes are the host's continued ones (sample_episodes(...,
    kv_continuation=True)) at the same key: ids, masks, rewards, turns equal; log-probs within
    1e-5 (sampled at temperature 1 and greedy);
(b) they are the fused re-prefilled ones, id for id;
(c) the loop stops once every episode is done: max_turns 3 or 12 give the same episodes, and
    the sampler runs max(turns) times, not 12."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.envs import StepResult, calculator_jax
from grpo_jax.envs.calculator import CalculatorEnv
from grpo_jax.envs.calculator_jax import CalculatorJax, _delta
from grpo_jax.envs.char_tokenizer import char_chat_tokenizer
from grpo_jax.rollout.episodes.host import sample_episodes
from grpo_jax.rollout.episodes.pure_jax import play_episodes
from grpo_jax.models.decoder import init_params
from grpo_jax.rollout.sampler import Sampling
from tests.fixtures import tiny_model_config

N, P_WIDTH, KEYS, IDS = 76, 56, (3, 5), list(range(100, 108))
REAL_STEP = calculator_jax.step


def _ends(last_digit):
  """The turn an episode's environment stops answering: 1 + (a * b mod 10) mod 3."""
  return 1 + last_digit % 3


class Persistent(CalculatorEnv):
  """The calculator env answering turn t < _ends(a * b) with the product as a tool message
  (not done), whatever the turn says; the real step after."""

  def step(self, state, assistant_turn):
    if state["turn"] + 1 < _ends(state["a"] * state["b"] % 10):
      state = dict(state, turn=state["turn"] + 1, tool_calls=state["tool_calls"] + 1)
      return StepResult(state, [{"role": "tool", "name": "calculator",
                                 "content": str(state["a"] * state["b"])}], None, False)
    return super().step(state, assistant_turn)


def persistent_step(spec, state, turn_ids, turn_mask):
  """Persistent.step in JAX: the product's delta (calculator_jax._delta) before the row's
  last turn, calculator_jax.step at it."""
  new, delta, length, reward, done = REAL_STEP(spec, state, turn_ids, turn_mask)
  early = new.turn < _ends(state.product[:, 0])
  answer, answer_len = _delta(spec, jnp.ones_like(early), state.product)
  return (new._replace(tool_calls=jnp.where(early, state.tool_calls + 1, new.tool_calls)),
          jnp.where(early[:, None], answer, delta), jnp.where(early, answer_len, length),
          jnp.where(early, 0.0, reward), done & ~early)


@pytest.fixture(scope="module")
def setup():
  tok = char_chat_tokenizer()
  env = Persistent(digits=3, max_turns=3, tool_parser="pythonic", question="{a}*{b}")
  cfg = tiny_model_config(vocab_size=128, num_layers=1)  # (ids past 99 decode to nothing)
  params = init_params(cfg, jax.random.key(0))
  sampling = Sampling(cfg, max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
  rows = env.rows("train", len(IDS))
  ab = tuple(jnp.array([r[k] for r in rows]) for k in ("a", "b"))
  return tok, env, params, sampling, rows, ab


@pytest.fixture(autouse=True)
def _persistent_env(monkeypatch):
  monkeypatch.setattr(calculator_jax, "step", persistent_step)


def _fused(setup, sampling, continued: bool, max_turns: int = 3):
  """The fused episodes at every key of KEYS, the seeds vmapped in one program."""
  tok, env, params, _, _, (a, b) = setup
  spec = dataclasses.replace(CalculatorJax.of(env, tok), max_turns=max_turns)
  play = lambda key: play_episodes(sampling, params, spec, a, b, key, N, P_WIDTH,  # noqa: E731
                                   P_WIDTH + N, jnp.array(IDS), kv_continuation=continued)
  return jax.jit(jax.vmap(play))(jnp.stack([jax.random.key(k) for k in KEYS]))


def _host(setup, sampling, key):
  tok, env, params, _, rows, _ = setup
  return sample_episodes(sampling, params, env, tok, rows, IDS, jax.random.key(key), N,
                         width_bucket=8, prompt_width=P_WIDTH, episode_ids=IDS,
                         kv_continuation=True)


def _seed(tree, i):
  return jax.tree.map(lambda x: np.asarray(x[i]), tree)


def _assert_same(ours, end, host, infos, atol):
  for name in ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask",
               "truncated", "action_mask"):
    np.testing.assert_array_equal(getattr(ours, name), np.asarray(getattr(host, name)),
                                  err_msg=name)
  np.testing.assert_allclose(ours.logprobs, host.logprobs, rtol=0, atol=atol)
  assert [i["reward"] for i in infos] == end.reward.tolist()
  assert [i["turns"] for i in infos] == end.turns.tolist()
  assert [i["state"]["tool_calls"] for i in infos] == end.env.tool_calls.tolist()


@pytest.mark.parametrize("greedy", [False, True])
def test_fused_continuation_is_the_hosts_and_the_reprefilled_ids(setup, greedy):
  sampling = setup[3].greedy() if greedy else setup[3]
  continued, ends = _fused(setup, sampling, True)
  reprefilled, ends_re = _fused(setup, sampling, False)
  for i, key in enumerate(KEYS):
    _assert_same(_seed(continued, i), _seed(ends, i), *_host(setup, sampling, key), atol=1e-5)
    _assert_same(_seed(continued, i), _seed(ends, i), _seed(reprefilled, i),
                 [dict(reward=r, turns=t, state=dict(tool_calls=c)) for r, t, c in zip(
                     *(np.asarray(x[i]).tolist() for x in (ends_re.reward, ends_re.turns,
                                                           ends_re.env.tool_calls)))],
                 atol=1e-5)
  turns = np.asarray(ends.turns)
  assert set(turns.ravel().tolist()) == {1, 2, 3}  # rows end at different turns
  assert np.asarray(ends.truncated).any() and not np.asarray(ends.truncated).all()
  env_ids = np.asarray(continued.completion_mask & ~continued.action_mask).sum()
  assert env_ids > 100  # the environment's answers are in the episodes


@dataclasses.dataclass(frozen=True)
class Counted:
  """The sampler, counting its calls on the host (one per turn the loop runs)."""
  inner: Sampling
  calls: list

  def __hash__(self):
    return hash(self.inner)

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def with_stats(self, *args):
    jax.debug.callback(lambda: self.calls.append(1))
    return self.inner.with_stats(*args)


def test_the_loop_stops_once_every_episode_is_done(setup):
  tok, env, params, sampling, _, (a, b) = setup
  spec = CalculatorJax.of(env, tok)
  runs = []
  for max_turns in (3, 12):
    counted = Counted(sampling, [])
    out = jax.jit(lambda key, s=dataclasses.replace(spec, max_turns=max_turns), c=counted:
                  play_episodes(c, params, s, a, b, key, N, P_WIDTH, P_WIDTH + N,
                                jnp.array(IDS)))(jax.random.key(KEYS[0]))
    runs.append((jax.tree.map(np.asarray, out), len(counted.calls)))
  (short, calls3), (long, calls12) = runs
  for x, y in zip(jax.tree.leaves(short), jax.tree.leaves(long)):
    np.testing.assert_array_equal(x, y)
  assert calls3 == calls12 == short[1].turns.max() == 3
