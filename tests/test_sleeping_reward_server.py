"""benchmarks/sleeping_reward_server.py on 127.0.0.1: remote.py's schema, concurrent requests
served concurrently, and rewards equal to the addition task's rule reward on the same rows (on
every row with benchmarks/lossless_addition.py's task; the plain task's text differing only
where its decode drops tokens); and benchmarks/async_overlap.py's readers of metrics.jsonl."""

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
from benchmarks.sleeping_reward_server import (addition_rewards, lossless_text,  # noqa: E402
                                               running_server, text_tokens)
from grpo_jax.data.arithmetic import AdditionTask  # noqa: E402
from grpo_jax.data.task import TASKS  # noqa: E402
from grpo_jax.rewards.remote import RemoteRewardConfig, score_remote  # noqa: E402
from grpo_jax.rewards.sources import row_texts  # noqa: E402


def _post(url: str, payload) -> tuple:
  data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
  request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=10) as answer:
      return answer.status, json.loads(answer.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def _completions(task: AdditionTask, batch):
  """Per prompt of `batch`: the right answer; a wrong digit; no <eos> (runs on); an extra digit;
  empty; the answer with <bos> inside; the answer then <pad> or id 15 instead of <eos>: (tokens,
  mask) of 8 rows per prompt."""
  rows = []
  eos, bos, pad = task.tokenizer.eos_id, task.tokenizer.bos_id, task.pad_id
  for target, keep in zip(batch.target_tokens, batch.target_mask):
    digits = target[keep].tolist()[:-1]  # the answer's digits, without its <eos>
    wrong = [3 + (digits[0] - 3 + 1) % 10] + digits[1:]
    rows += [digits + [eos], wrong + [eos], digits + [digits[0]], digits + [digits[-1], eos],
             [eos], digits[:1] + [bos] + digits[1:] + [eos], digits + [pad], digits + [15]]
  width = max(len(r) for r in rows)
  tokens = np.full((len(rows), width), pad, np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], mask[i, :len(r)] = r, True
  return tokens, mask


@pytest.fixture
def lossless_task():
  """The task benchmarks/lossless_addition.py registers, unregistered after the test (other
  tests in this process see the built-in tasks only)."""
  from benchmarks.lossless_addition import LosslessAdditionTask  # noqa: PLC0415
  yield LosslessAdditionTask(2, 500, 5, fixed_width=True, reverse_answer=True)
  TASKS.unregister("addition_lossless")
  sys.modules.pop("benchmarks.lossless_addition", None)


def _server_rewards(task, batch, tokens, mask, group):
  prompts, completions, labels = row_texts(task, batch, tokens, mask, group)
  queries = [p + c for p, c in zip(prompts, completions)]
  with running_server(sleep_s=0.0) as server:
    result = score_remote(RemoteRewardConfig(url=server.url, batch_size=16, max_concurrency=3),
                          queries, prompts, labels)
  assert not result.failed.any()
  assert addition_rewards(queries, prompts, labels) == result.rewards.tolist()
  return result.rewards


def test_schema_and_bad_requests():
  with running_server(sleep_s=0.0) as server:
    status, body = _post(server.url, {"queries": ["07+68=570", "07+68=571"],
                                      "prompts": ["07+68=", "07+68="], "labels": ["570", "570"]})
    assert (status, body) == (200, {"rewards": [1.0, 0.0]})
    status, body = _post(server.url, {"queries": [], "prompts": [], "labels": []})
    assert (status, body) == (200, {"rewards": []})
    for bad in (b"{not json", {"queries": ["a"]}, {"queries": ["a"], "prompts": [],
                                                   "labels": []}):
      status, body = _post(server.url, bad)
      assert status == 400 and body["error"]


def test_two_requests_overlap_in_time():
  sleep_s = 0.4
  payload = {"queries": ["1+1=2"], "prompts": ["1+1="], "labels": ["2"]}
  with running_server(sleep_s=0.0) as server:
    _post(server.url, payload)  # JAX's first dispatch of the reward, out of the timing
  with running_server(sleep_s=sleep_s) as server:
    threads = [threading.Thread(target=_post, args=(server.url, payload)) for _ in range(2)]
    started = time.monotonic()
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    wall = time.monotonic() - started
    (a0, a1, _), (b0, b1, _) = server.spans
  assert max(a0, b0) < min(a1, b1), "the two requests were not in flight at the same time"
  assert sleep_s <= wall < 1.75 * sleep_s


def test_rewards_equal_the_rule_reward_on_every_row(lossless_task):
  task = lossless_task
  batch = task.test_batch(8)
  group = 8
  tokens, mask = _completions(task, batch)
  rule = task.score(batch, tokens, mask, group)
  assert rule.tolist() == [1.0, 0, 0, 0, 0, 0, 0, 0] * len(batch.operands)
  np.testing.assert_array_equal(_server_rewards(task, batch, tokens, mask, group), rule)


def test_plain_addition_text_loses_only_what_decode_drops():
  task = AdditionTask(2, 500, 5, fixed_width=True, reverse_answer=True)
  batch = task.test_batch(8)
  group = 8
  tokens, mask = _completions(task, batch)
  rule = task.score(batch, tokens, mask, group)
  rewards = _server_rewards(task, batch, tokens, mask, group)
  # <bos> inside the answer, and <pad> or id 15 instead of <eos>, decode as the right answer.
  lossy = np.tile(np.array([0, 0, 0, 0, 0, 1, 1, 1], bool), len(batch.operands))
  np.testing.assert_array_equal(rewards[~lossy], rule[~lossy])
  assert rewards[lossy].tolist() == [1.0] * lossy.sum()


def test_lossless_text_reads_back():
  ids = [3, 1, 0, 2, 15, 14]
  assert lossless_text(ids) == "0<bos><pad><eos><id:15>="
  assert text_tokens(lossless_text(ids)) == ids
  assert text_tokens("570") == text_tokens("570<eos>") == [8, 10, 3, 2]
  assert text_tokens("57x") is None and text_tokens("5<oops>") is None


def test_a_row_off_the_alphabet_or_prompt_scores_zero():
  assert addition_rewards(["07+68=5x0", "99+01=570", "07+68=570"],
                          ["07+68=", "07+68=", "07+68="], ["570", "570", "570"]) == [0.0, 0.0,
                                                                                      1.0]


def test_the_benchmark_reads_steps_per_minute_and_matched_steps():
  from benchmarks.async_overlap import (at_evaluations, seed_spread, steps_per_minute,
                                        within_spread)
  records = [{"step": 0, "eval_accuracy": 0.1}]
  records += [{"step": s, "reward_mean": s / 10, "elapsed_s": 30.0 + 2.0 * s} for s in (1, 2, 3)]
  records += [{"step": 4, "reward_mean": 0.4, "elapsed_s": 38.0, "eval_accuracy": 0.5}]
  assert steps_per_minute(records) == 2 / 4.0 * 60  # steps 3 and 4 in 38 - 34 s
  evaluations = at_evaluations(records)
  assert evaluations == {4: (0.25, 0.5)}  # reward_mean over steps 1-4
  other = {4: (0.35, 0.7)}
  spread = seed_spread({0: evaluations, 1: other})
  assert spread == {4: (0.25, 0.35, 0.5, 0.7)}
  assert within_spread({4: (0.3, 0.8)}, spread) == {4: (True, False)}
