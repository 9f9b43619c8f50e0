"""Remote rewards against real HTTP servers on 127.0.0.1 (ephemeral ports, a daemon thread
each): values and row order across concurrent chunks, step_rewards, and each server fault
(timeout, HTTP 5xx / 4xx, malformed JSON, wrong shape, non-finite values) failing the rows it
touches and no others, retried only when another attempt may help."""

import http.server
import json
import math
import re
import socket
import threading
import time

import numpy as np
import pytest

from grpo_jax.errors import ConfigError
from grpo_jax.rewards.remote import (RemoteRewardConfig, backoff_delay, raise_first,
                                     score_remote)
from grpo_jax.errors import RewardError


def _reward(query: str, label) -> float:
  return float((len(query) * 3 + int(label)) % 7)


def _good(body, n):  # noqa: ARG001
  return 200, {"rewards": [_reward(q, l) for q, l in zip(body["queries"], body["labels"])]}


class _Handler(http.server.BaseHTTPRequestHandler):
  def do_POST(self):  # noqa: N802
    box = self.server.box
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with box.lock:
      n = len(box.requests)
      box.requests.append((self.headers, body))
      box.in_flight += 1
      box.peak = max(box.peak, box.in_flight)
    status, payload, *delay = box.respond(body, n)
    if delay:
      box.release.wait(delay[0])
    with box.lock:
      box.in_flight -= 1
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)
    except OSError:  # the client gave up (a timeout test)
      pass

  def log_message(self, *args):
    pass


class _Box:
  """One server: respond(body, n) -> (status, JSON value or raw bytes[, seconds to stall])."""

  def __init__(self, respond):
    self.respond, self.requests, self.lock = respond, [], threading.Lock()
    self.release, self.in_flight, self.peak = threading.Event(), 0, 0
    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    self.server.box = self
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
    threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

  def close(self):
    self.release.set()
    self.server.shutdown()
    self.server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
  for name in ("no_proxy", "NO_PROXY"):  # urllib would send 127.0.0.1 through http_proxy
    monkeypatch.setenv(name, "127.0.0.1,localhost")


@pytest.fixture
def serve():
  """serve(respond) -> a running _Box; every one is shut down after the test."""
  boxes = []
  yield lambda respond: boxes.append(_Box(respond)) or boxes[-1]
  for box in boxes:
    box.close()


def _rows(n: int):
  queries = [f"q{'x' * i} answer" for i in range(n)]
  return queries, [f"p{i}" for i in range(n)], list(range(n))


def _cfg(url, **overrides):
  return RemoteRewardConfig(url=url, **{"timeout_s": 2.0, "max_retries": 1, "backoff_s": 0.01,
                                        **overrides})


def test_values_in_row_order_across_concurrent_chunks(serve):
  # the first chunk answers last: the order of the rows must not follow the order of answers
  box = serve(lambda body, n: _good(body, n) + ((0.15,) if body["labels"][0] == 0 else (0.05,)))
  queries, prompts, labels = _rows(10)
  cfg = _cfg(box.url, batch_size=3, max_concurrency=3, headers=(("Authorization", "Bearer t"),))
  result = score_remote(cfg, queries, prompts, labels)
  np.testing.assert_array_equal(result.rewards, [_reward(q, l) for q, l in zip(queries, labels)])
  assert result.rewards.dtype == np.float32 and result.rewards.shape == (10,)
  assert not result.failed.any() and result.errors == [] and result.step_rewards is None
  assert len(box.requests) == 4 and 1 < box.peak <= 3
  for headers, body in box.requests:
    assert set(body) == {"queries", "prompts", "labels"}
    assert headers["Content-Type"] == "application/json" and headers["Authorization"] == "Bearer t"
  sent = sorted((b for _, b in box.requests), key=lambda b: b["labels"][0])
  assert [len(b["queries"]) for b in sent] == [3, 3, 3, 1]
  assert sum((b["queries"] for b in sent), []) == queries
  assert sum((b["prompts"] for b in sent), []) == prompts
  assert sum((b["labels"] for b in sent), []) == labels


def test_step_rewards_and_a_bare_list(serve):
  def respond(body, n):  # noqa: ARG001
    rewards = _good(body, n)[1]["rewards"]
    if body["labels"][0] == 0:
      return 200, {"rewards": rewards, "step_rewards": [[r / 2, r / 2] for r in rewards],
                   "extra": 1}
    return 200, rewards  # a bare list: rewards and no step_rewards

  queries, prompts, labels = _rows(4)
  result = score_remote(_cfg(serve(respond).url, batch_size=2), queries, prompts, labels)
  expected = [_reward(q, l) for q, l in zip(queries, labels)]
  np.testing.assert_array_equal(result.rewards, expected)
  assert not result.failed.any()
  assert result.step_rewards == [[r / 2, r / 2] for r in expected[:2]] + [None, None]


def test_a_slow_server_times_out_after_every_attempt(serve):
  box = serve(lambda body, n: _good(body, n) + (5.0,))
  queries, prompts, labels = _rows(4)
  start = time.perf_counter()
  result = score_remote(_cfg(box.url, timeout_s=0.2), queries, prompts, labels)
  assert time.perf_counter() - start < 2.0
  assert result.failed.all() and not result.rewards.any()
  assert len(box.requests) == 2  # 1 + max_retries
  (error,) = result.errors
  assert re.fullmatch(rf"remote reward 'remote' at {box.url}: timed out after 0\.2 s "
                      rf"\(2 attempts in 0\.\d s\); rows 0-3 scored 0", error), error


def test_a_500_then_200_recovers_by_a_retry(serve):
  box = serve(lambda body, n: (500, b"busy") if n == 0 else _good(body, n))
  queries, prompts, labels = _rows(4)
  result = score_remote(_cfg(box.url), queries, prompts, labels)
  assert not result.failed.any() and result.errors == [] and len(box.requests) == 2
  np.testing.assert_array_equal(result.rewards, [_reward(q, l) for q, l in zip(queries, labels)])


@pytest.mark.parametrize("status,attempts", [(500, 3), (503, 3), (429, 3), (404, 1), (400, 1)])
def test_http_errors_retry_only_5xx_and_429(serve, status, attempts):
  box = serve(lambda body, n: (status, b"went\nwrong " + b"x" * 300))
  queries, prompts, labels = _rows(4)
  result = score_remote(_cfg(box.url, max_retries=2), queries, prompts, labels)
  assert result.failed.all() and len(box.requests) == attempts
  (error,) = result.errors
  counted = f"{attempts} attempts in " if attempts > 1 else "1 attempt): "
  assert error.startswith(f"remote reward 'remote' at {box.url}: answered HTTP {status} "
                          f"({counted}")
  assert ": 'went\\nwrong xxx" in error
  assert error.endswith("...'; rows 0-3 scored 0") and "\n" not in error


def test_an_unreachable_server_fails_after_its_retries():
  with socket.socket() as s:  # a port that nothing listens on once closed
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}/score"
  result = score_remote(_cfg(url), *_rows(2))
  assert result.failed.all()
  assert result.errors[0].startswith(f"remote reward 'remote' at {url}: request failed "
                                     f"(2 attempts in ")


@pytest.mark.parametrize("payload,reason", [
    (b"<html>oops</html>", "returned malformed JSON (Expecting value: line 1 column 1): "
                           "'<html>oops</html>'"),
    ({"score": [1, 2]}, "returned an object with keys ['score'] instead of"),
    ({"rewards": [1, "a"]}, "returned a non-numeric reward 'a' for row 1"),
    ({"rewards": [1, None]}, "returned a non-numeric reward 'null' for row 1"),
    ({"rewards": [1, 2], "step_rewards": [[1], "x"]}, "returned step_rewards for row 1 that"),
])
def test_bad_answers_fail_their_chunk_without_a_retry(serve, payload, reason):
  box = serve(lambda body, n: (200, payload))
  result = score_remote(_cfg(box.url, batch_size=2, max_retries=3), *_rows(4))
  assert result.failed.all() and len(box.requests) == 2  # one request per chunk
  assert result.errors[0].startswith(f"remote reward 'remote' at {box.url}: {reason}")
  assert result.errors[0].endswith("; rows 0-1 scored 0")


def test_a_wrong_number_of_rewards_fails_the_chunk(serve):
  box = serve(lambda body, n: (200, {"rewards": [1.0, 2.0, 3.0]}))
  result = score_remote(_cfg(box.url), *_rows(4))
  assert result.failed.all() and len(box.requests) == 1
  assert result.errors == [f"remote reward 'remote' at {box.url}: returned 3 rewards for 4 rows; "
                           f"rows 0-3 scored 0"]


def test_a_non_finite_value_fails_only_its_row(serve):
  def respond(body, n):  # noqa: ARG001
    if body["labels"][0] == 2:  # JSON's NaN, Infinity, and a number beyond float32
      return 200, b'{"rewards": [NaN, 1.5], "step_rewards": [[1], [Infinity]]}'
    if body["labels"][0] == 4:
      return 200, b'{"rewards": [1e300, 2.5]}'
    return 200, {"rewards": [0.5, 0.25], "step_rewards": [[0.5], [0.25]]}

  result = score_remote(_cfg(serve(respond).url, batch_size=2), *_rows(6))
  np.testing.assert_array_equal(result.failed, [False, False, True, True, True, False])
  np.testing.assert_array_equal(result.rewards, [0.5, 0.25, 0, 0, 0, 2.5])
  assert result.step_rewards == [[0.5], [0.25], None, None, None, None]
  assert [e.split(": ", 1)[1] for e in result.errors] == [
      "returned a non-finite reward nan for row 2",
      "returned a non-finite step reward inf for row 3",
      "returned a reward 1e+300 beyond float32's range for row 4"]


def test_an_integer_beyond_floats_range_keeps_its_sign(serve):
  huge = b"1" + b"0" * 400  # a JSON int that float() overflows on
  result = score_remote(_cfg(serve(lambda body, n: (200, b'{"rewards": [-' + huge + b", "
                                                    + huge + b"]}")).url, batch_size=2),
                        *_rows(2))
  assert [e.split(": ", 1)[1] for e in result.errors] == [
      "returned a non-finite reward -inf for row 0",
      "returned a non-finite reward inf for row 1"]


def test_only_the_failing_chunks_rows_fail(serve):
  def respond(body, n):
    return (400, b"bad query") if "BAD" in body["queries"] else _good(body, n)

  queries, prompts, labels = _rows(10)
  queries[4] = "BAD"
  result = score_remote(_cfg(serve(respond).url, batch_size=3, max_concurrency=2), queries,
                        prompts, labels)
  expected = [0.0 if 3 <= i <= 5 else _reward(q, l)
              for i, (q, l) in enumerate(zip(queries, labels))]
  np.testing.assert_array_equal(result.rewards, expected)
  np.testing.assert_array_equal(np.flatnonzero(result.failed), [3, 4, 5])
  (error,) = result.errors
  assert "answered HTTP 400 (1 attempt): 'bad query'; rows 3-5 scored 0" in error


def test_raise_first_raises_one_line(serve):
  box = serve(lambda body, n: (200, {"rewards": [math.nan] * len(body["queries"])}))
  result = score_remote(_cfg(box.url), *_rows(3))
  with pytest.raises(RewardError) as info:
    raise_first(result)
  message = str(info.value)
  assert "\n" not in message and message.startswith(f"remote reward 'remote' at {box.url}: ")
  assert message.endswith("returned a non-finite reward nan for row 0; fix the server or set "
                          "train.on_reward_error='zero' to score such completions 0 and count "
                          "them.")
  raise_first(score_remote(_cfg(serve(_good).url), *_rows(3)))  # nothing failed: no raise


@pytest.mark.parametrize("overrides,field", [
    ({"url": "ftp://host/score"}, "url="), ({"url": "localhost:8000"}, "url="),
    ({"url": "http://"}, "url="), ({"name": ""}, "name="), ({"timeout_s": 0}, "timeout_s="),
    ({"timeout_s": math.inf}, "timeout_s="), ({"batch_size": 0}, "batch_size="),
    ({"batch_size": 2.5}, "batch_size="), ({"max_concurrency": 0}, "max_concurrency="),
    ({"max_retries": -1}, "max_retries="), ({"backoff_s": -0.1}, "backoff_s="),
    ({"headers": (("Authorization",),)}, "headers has entry 0"),
    ({"url": "http://127.0.0.1:99999/score"}, "url="), ({"url": "http://host:8o00/s"}, "url="),
    ({"timeout_s": 1e10}, "timeout_s="),  # past the timers' range (OverflowError)
])
def test_bad_configs_name_the_field(overrides, field):
  cfg = RemoteRewardConfig(**{"url": "http://127.0.0.1:1/score", **overrides})
  with pytest.raises(ConfigError, match=f"^reward.remote.{field}") as info:
    cfg.check("reward.remote")
  assert "\n" not in str(info.value)
  with pytest.raises(ConfigError):  # before any request
    score_remote(cfg, ["q"], ["p"], [0])


def test_header_values_stay_out_of_messages():
  cfg = RemoteRewardConfig(url="http://127.0.0.1:1/score",
                           headers=(("Authorization", "Bearer secret", "x"),))
  with pytest.raises(ConfigError, match="headers has entry 0") as info:
    cfg.check()
  assert "secret" not in str(info.value)
  # a value http.client would refuse at every request (reported as an outage, the value shown)
  for value in ("Bearer secret\n", "Bearer se\u2019cret"):
    cfg = RemoteRewardConfig(url="http://127.0.0.1:1/score", headers=(("Authorization", value),))
    with pytest.raises(ConfigError, match="headers has entry 0 with a line break") as info:
      cfg.check()
    assert "secret" not in str(info.value)
  cfg = RemoteRewardConfig(url="http://user:secret@127.0.0.1:1/score")
  with pytest.raises(ConfigError, match="^RemoteRewardConfig.url='http://127.0.0.1:1/score' has"):
    cfg.check()


def test_caller_errors_and_no_rows():
  cfg = _cfg("http://127.0.0.1:1/score")
  with pytest.raises(ValueError, match="got 2 queries, 1 prompts and 2 labels"):
    score_remote(cfg, ["a", "b"], ["p"], [0, 1])
  with pytest.raises(TypeError, match="rows 0-0 cannot be sent as JSON"):
    score_remote(cfg, ["a"], ["p"], [object()])
  result = score_remote(cfg, [], [], [])
  assert result.rewards.shape == (0,) and result.failed.shape == (0,) and result.errors == []


def test_backoff_doubles_up_to_a_cap():
  assert [backoff_delay(0.5, k) for k in range(6)] == [0.5, 1, 2, 4, 8, 8]
  assert backoff_delay(0.5, 10_000) == 8
