"""The calculator environment as pure JAX functions (grpo_jax/envs/calculator_jax.py) and its
episode loop in one traced program (grpo_jax/rollout/episodes/pure_jax.py) against the host env and
`sample_episodes`: the same step on hand-written turns, the same episodes id for id at the
same key (a scripted policy that calls the tool, answers and runs out of room; a tiny random
model through the real sampler), and seeds vmapped giving each seed's episodes."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo_calculator_tiny
from grpo_jax.config import validate
from grpo_jax.envs.calculator import CalculatorEnv
from grpo_jax.envs.calculator_jax import ERROR_CONTENT, CalculatorJax, reset, step
from grpo_jax.envs.char_tokenizer import char_chat_tokenizer
from grpo_jax.envs.chat import environment_delta_ids, render
from grpo_jax.rollout.episodes.host import sample_episodes
from grpo_jax.rollout.episodes.pure_jax import play_episodes
from grpo_jax.errors import ConfigError
from grpo_jax.models.decoder import init_params
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.rollout.types import Rollout
from grpo_jax.train.sources.fused_episodes import check_fused_episodes
from tests.fixtures import tiny_model_config

A, B = 123, 456
CALL = "[calculator(expression='{a}*{b}')]"
# Turns where the JAX env is the host env + environment_delta_ids, id for id.
AGREE = ["Answer: 56088", "Answer: 56,088", "Answer:00056088", "Answer: -56088",
         "Answer: 56089", "Answer: ,", "Answer:", "x Answer: y Answer: 56088", "hello", "[[calc",
         CALL.format(a=A, b=B), '[calculator(expression="123*456")]',
         "Let me [calculator(expression='7*0')] ok", "[calculator(expression='999999*999999')]",
         "[calculator(expression='1*2')] and Answer: 56088",
         "<|im_start|>Answer: 56088", "[calculator(expression='3*4')]<|im_start|>",
         "Answer: 56088.", "Answer: 56088.5", "Answer: 56,088e3", "Answer: 56088.E1 ok",
         "x Answer: 56088.5 Answer: 56088", "Answer: 56088.5 [calculator(expression='3*4')]"]
# Calls whose host message depends on free text: the JAX env answers ERROR_CONTENT.
DIFFER = ["[calculator(expression='12 * 34')]", "[python(code='1')]",
          "[calculator(expression='012*3')]", "[calculator(expression='1234567*2')]",
          "[calculator(expression='1*2')] x [calculator(expression='3*4')]",
          "[calculator(expression='3<|im_end|>*4')]"]


@pytest.fixture(scope="module")
def calc():
  tok = char_chat_tokenizer()
  env = CalculatorEnv(digits=3, max_turns=2, tool_parser="pythonic", question="{a}*{b}")
  return tok, env, CalculatorJax.of(env, tok)


def _ids(tok, texts, width=64):
  ids, mask = np.zeros((len(texts), width), np.int32), np.zeros((len(texts), width), bool)
  for i, t in enumerate(texts):
    e = tok.encode(t, add_special_tokens=False)
    ids[i, :len(e)], mask[i, :len(e)] = e, True
  return ids, mask


def test_reset_renders_the_hosts_prompt(calc):
  tok, env, spec = calc
  _, prompt = reset(spec, jnp.array([A, 907]), jnp.array([B, 100]))
  for row, ids in zip(({"a": A, "b": B}, {"a": 907, "b": 100}), prompt.tolist()):
    text = render(tok, env.reset(row, 0)[1], env.tools, add_generation_prompt=True)
    assert ids == tok.encode(text, add_special_tokens=False)


def test_step_is_the_host_env_and_its_delta_ids(calc):
  tok, env, spec = calc
  texts = AGREE + DIFFER + ["(an unknown id)"]
  ids, mask = _ids(tok, texts)
  # An id the tokenizer does not know decodes to nothing on the host: "Ans?wer: 56088".
  unknown = tok.encode("Answer: 56088", add_special_tokens=False)
  ids[-1, :len(unknown) + 1] = unknown[:3] + [120] + unknown[3:]
  mask[-1, :len(unknown) + 1] = True
  texts[-1] = tok.decode(ids[-1][mask[-1]].tolist(), skip_special_tokens=False)
  rows = len(texts)
  state, _ = reset(spec, jnp.full(rows, A), jnp.full(rows, B))
  last_turn = state._replace(turn=jnp.ones(rows, jnp.int32))  # the second of max_turns=2
  run = jax.jit(step, static_argnums=0)
  _, delta, length, reward, done = run(spec, state, ids, mask)
  _, _, _, reward2, done2 = run(spec, last_turn, ids, mask)
  host_state, messages = env.reset({"a": A, "b": B}, 0)
  error = (list(spec.delta_head) + tok.encode(ERROR_CONTENT, add_special_tokens=False)
           + list(spec.delta_tail))
  for i, text in enumerate(texts):
    result = env.step(host_state, text)
    assert bool(done[i]) == result.done, text
    assert float(reward[i]) == float(result.reward or 0.0), text
    again = env.step(dict(host_state, turn=1), text)
    assert bool(done2[i]) and float(reward2[i]) == float(again.reward), text
    if result.done:
      continue
    ours = delta[i, :length[i]].tolist()
    if texts[i] in DIFFER:
      assert ours == error, text
    else:
      assert ours == environment_delta_ids(tok, messages, text, result.messages, env.tools,
                                           tok.eos_token), text
  assert float(reward[-1]) == 1.0 and bool(done[-1])


@dataclasses.dataclass(frozen=True)
class ScriptedSampling:
  """A policy stub with the sampler's call: row r's turn k emits script[r][k] (cut at its row
  limit; no end-of-turn token unless the script has one). The turn is read from the input:
  the prompt's three <|im_start|> and two more per environment answer."""
  script: tuple
  max_new_tokens: int
  eos_id: int
  pad_id: int
  im_start: int

  def with_stats(self, params, tokens, mask, key, row_limits=None, row_ids=None):
    del params, key
    m, rows = self.max_new_tokens, tokens.shape[0]
    table = np.full((len(self.script), 2, m), self.pad_id, np.int32)
    lengths = np.zeros((len(self.script), 2), np.int32)
    for r, turns in enumerate(self.script):
      for k, ids in enumerate(turns):
        table[r, k, :min(len(ids), m)], lengths[r, k] = ids[:m], min(len(ids), m)
    row = jnp.arange(rows) if row_ids is None else jnp.asarray(row_ids)
    opened = jnp.sum((jnp.asarray(tokens) == self.im_start) & jnp.asarray(mask), axis=1)
    turn = jnp.clip((opened - 3) // 2, 0, 1)
    count = jnp.minimum(jnp.asarray(lengths)[row, turn], jnp.asarray(row_limits))
    live = jnp.arange(m)[None, :] < count[:, None]
    ids = jnp.where(live, jnp.asarray(table)[row, turn], self.pad_id)
    logp = jnp.where(live, -0.01 * (jnp.arange(m)[None, :] + 1) - 0.1 * turn[:, None], 0.0)
    return Rollout(tokens, mask, ids, live, logp, jnp.zeros(rows, bool), live), None


def _compare(host, infos, ours, end, rtol=0.0):
  """The episodes equal (log-probs to rtol: 0 = bit for bit)."""
  for name in ("prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask",
               "truncated", "action_mask"):
    np.testing.assert_array_equal(np.asarray(getattr(host, name)),
                                  np.asarray(getattr(ours, name)), err_msg=name)
  np.testing.assert_allclose(np.asarray(ours.logprobs), np.asarray(host.logprobs), rtol=rtol,
                             atol=0)
  assert [i["reward"] for i in infos] == np.asarray(end.reward).tolist()
  assert [i["turns"] for i in infos] == np.asarray(end.turns).tolist()
  assert [i["state"]["tool_calls"] for i in infos] == np.asarray(end.env.tool_calls).tolist()


def test_scripted_episodes_are_the_hosts(calc):
  tok, env, spec = calc
  rows = env.rows("train", 8)
  eos = [tok.eos_token_id]
  enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
  scripts = []
  for i, r in enumerate(rows):
    call, p = enc(CALL.format(**r)) + eos, r["a"] * r["b"]
    scripts.append([
        [call, enc(f"Answer: {p}") + eos],  # the tool, then the answer: reward 1
        [enc("Ans") + [120] + enc(f"wer: {p:,}") + eos],  # an unknown id, commas: reward 1
        [enc(f"Answer: {p + 1}") + eos],  # wrong
        [enc("[[calc")],  # no call, no end-of-turn: closed by the environment
        [enc("x" * 100)],  # cut at max_new_tokens, closed, no call
        [call, call],  # calls until max_turns: reward 0
        [enc("y" * 45) + call],  # the tool's answer does not fit N: truncated
        [call, enc("z" * 45)],  # the second turn runs out of N: truncated
    ][i])
  sampling = ScriptedSampling(tuple(tuple(map(tuple, s)) for s in scripts), 96,
                              tok.eos_token_id, tok.pad_token_id, 1)
  n, p_width = 100, 56
  ids = list(range(8))
  host, infos = sample_episodes(sampling, None, env, tok, rows, ids, jax.random.key(0), n,
                                width_bucket=p_width + n, prompt_width=p_width, episode_ids=ids)
  ab = [jnp.array([r[k] for r in rows]) for k in ("a", "b")]
  ours, end = jax.jit(lambda a, b: play_episodes(sampling, None, spec, a, b, jax.random.key(0),
                                                 n, p_width, p_width + n, jnp.array(ids)))(*ab)
  _compare(host, infos, ours, end)
  assert np.asarray(end.reward).tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
  assert np.asarray(end.truncated).tolist() == [False] * 6 + [True, True]
  assert np.asarray(end.turns).tolist() == [2, 1, 1, 1, 1, 2, 1, 2]


N, P_WIDTH, KEYS = 24, 56, (3, 5)


def test_random_model_episodes_are_the_hosts_and_seeds_vmap(calc):
  """Through the real sampler: each of two seeds vmapped in one program plays the host's
  episodes at its key (ids, masks, rewards equal; log-probs to float rounding, which vmap
  may change)."""
  tok, env, spec = calc
  cfg = tiny_model_config(vocab_size=128, num_layers=1)  # (ids past 99 decode to nothing)
  params = init_params(cfg, jax.random.key(0))
  sampling = Sampling(cfg, max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
  rows, ids = env.rows("train", 8), list(range(100, 108))
  a, b = (jnp.array([r[k] for r in rows]) for k in ("a", "b"))
  play = lambda key: play_episodes(sampling, params, spec, a, b, key, N, P_WIDTH,  # noqa: E731
                                   P_WIDTH + N, jnp.array(ids))
  both, ends = jax.jit(jax.vmap(play))(jnp.stack([jax.random.key(k) for k in KEYS]))
  for i, k in enumerate(KEYS):
    host = sample_episodes(sampling, params, env, tok, rows, ids, jax.random.key(k), N,
                           width_bucket=P_WIDTH + N, prompt_width=P_WIDTH, episode_ids=ids)
    _compare(*host, *jax.tree.map(lambda x, i=i: x[i], (both, ends)), rtol=1e-6)
  assert not np.array_equal(both.completion_tokens[0], both.completion_tokens[1])


def test_fused_episodes_runs_the_demo_and_refuses_what_it_cannot():
  config = grpo_calculator_tiny.get_config()
  config.train.experience_source, config.train.fused_steps = "fused_episodes", 4
  validate(config)
  config.env.tool_parser = "hermes"
  with pytest.raises(ConfigError, match="env.tool_parser='pythonic'"):
    validate(config)
  settings = types.SimpleNamespace(gfpo_keep=0, dynamic_sampling=False)
  run = types.SimpleNamespace(task=types.SimpleNamespace(capabilities=("episodes",),
                                                         env=object()),
                              settings=settings, needs=())
  with pytest.raises(ConfigError, match="no JAX form"):
    check_fused_episodes(run)
