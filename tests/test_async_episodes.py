"""Asynchronous turns (env.async_slots, rollout/episodes/async_turns.py): on a tiny random float32
model, the episodes are the lock-step loop's (with and without KV continuation) id for id,
their log-probs within 1e-5, whatever the number of decode slots and whatever the tools'
timing; and one slow tool does not stall the other episodes."""

import random
import threading
import time

import jax

from grpo_jax.envs import StepResult
from grpo_jax.rollout.episodes.host import sample_episodes
from tests.test_kv_continuation import _assert_same_episodes, setup  # noqa: F401  (fixture)

ROWS = ["What is 2 + 2?", "Hi.", "Count to three, slowly please.", "Say hi.", "Go on.", "Why?"]


class SlowUneven:
  """Row-dependent episodes (row i ends after 1 + i % 3 turns; answers of row- and
  turn-dependent lengths) whose steps sleep: `sleep(seed, turn)` seconds."""
  tools = ()
  max_turns, max_concurrency = 3, 8

  def __init__(self, sleep=lambda seed, turn: 0.0):
    self.sleep, self.finished, self.lock = sleep, {}, threading.Lock()

  def reset(self, row, seed):
    return {"turn": 0, "ends": 1 + seed % 3, "seed": seed}, [{"role": "user", "content": row}]

  def step(self, state, turn):
    time.sleep(self.sleep(state["seed"], state["turn"]))
    state = dict(state, turn=state["turn"] + 1)
    done = state["turn"] >= state["ends"]
    with self.lock:
      self.finished[(state["seed"], state["turn"])] = time.monotonic()
    answer = {"role": "user", "content": "again " * (1 + (state["seed"] + state["turn"]) % 4)}
    return StepResult(state, [answer], float(len(turn)) if done else None, done)


def _play(setup, env, n=60, **how):
  tok, params, sampling = setup
  return sample_episodes(sampling, params, env, tok, ROWS, list(range(len(ROWS))),
                         jax.random.key(3), n, width_bucket=96, prompt_width=32,
                         episode_ids=[10 + i for i in range(len(ROWS))], **how)


def test_async_episodes_are_the_lockstep_ones_with_any_slots_and_tool_timing(setup):
  lockstep = _play(setup, SlowUneven(), kv_continuation=True)
  rollout, infos = lockstep
  assert len({i["turns"] for i in infos}) >= 2  # episodes end at different turns
  assert 0 < sum(i["truncated"] for i in infos) < len(ROWS)  # one spends its budget
  assert (~rollout.action_mask & rollout.completion_mask).sum() > 10  # environment ids
  _assert_same_episodes(_play(setup, SlowUneven(), kv_continuation=False), lockstep)
  for slots, seed in ((len(ROWS), 0), (2, 1), (1, 2)):
    draws = random.Random(seed)
    sleepy = SlowUneven(lambda s, t, d=draws: d.random() * 0.05)
    _assert_same_episodes(_play(setup, sleepy, async_slots=slots), lockstep)


def test_a_slow_tool_does_not_stall_the_other_episodes(setup):
  """Episode 2 (three turns) waits 1.5 s on its first step; the others' steps are instant.
  Asynchronously, every other episode has finished all its turns before that step returns;
  in lock-step, none gets past its first turn before it."""
  slow = lambda seed, turn: 1.5 if (seed, turn) == (2, 0) else 0.0  # noqa: E731
  for how, others_first in ((dict(async_slots=len(ROWS)), True),
                            (dict(kv_continuation=True), False)):
    env = SlowUneven(slow)
    _, infos = _play(setup, env, n=200, **how)
    slow_back = env.finished[(2, 1)]
    others = [t for (seed, turn), t in env.finished.items() if seed != 2 and turn >= 2]
    assert others, infos
    assert all(t < slow_back for t in others) is others_first, how


def test_the_switch_is_off_by_default_reaches_the_task_and_refuses_bad_values():
  """env.async_slots: 0 (lock-step) by default; the task carries it to the episodes source
  and the evaluation; a negative count, or asynchronous turns with the pure-JAX source (no
  host tool to wait on), is one sentence before any compute."""
  import pytest  # noqa: PLC0415
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.data.env_task import EnvTask  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  c = grpo_calculator_tiny.get_config()
  assert c.env.async_slots == 0
  c.env.async_slots = 16
  EnvTask.check_config(c)
  assert EnvTask.from_config(c, tokenizer="char", test_size=4, prompt_width=56).async_slots == 16
  c.env.async_slots = -1
  with pytest.raises(ConfigError, match=r"env.async_slots=-1 .* >= 0"):
    EnvTask.check_config(c)
  c.env.async_slots, c.train.experience_source = 4, "fused_episodes"
  with pytest.raises(ConfigError, match=r"env.async_slots=4 .*fused_episodes"):
    EnvTask.check_config(c)
