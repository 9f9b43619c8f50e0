"""The HTTP clients of the remote reward servers and the distillation teacher against servers
on 127.0.0.1 that misbehave (a daemon thread each, ephemeral ports): a total deadline per
request (a server trickling its answer or its headers fails at it), no redirect followed (the
credential never reaches the second server), a spent retry budget raised as RemoteOutage, the
teacher's log-probs checked (strings, values above 0, the wrong count: one sentence naming the
URL), and a teacher URL with user:password@ refused without echoing the password."""

import http.server
import json
import signal
import threading
import time
import types

import numpy as np
import pytest

from grpo_jax.errors import ConfigError, RemoteOutage, RewardError, RunStopped
from grpo_jax.rewards.http_deadline import (Abandoned, DeadlineExceeded, HttpStatus, fetch,
                                            map_abandoning)
from grpo_jax.rewards.remote import RemoteRewardConfig, raise_first, score_remote
from grpo_jax.rewards.remote_teacher import RemoteTeacher, settings_problem


class _Handler(http.server.BaseHTTPRequestHandler):
  """Records (method, path, headers) and runs the server's `answer(handler, body)`."""

  def _handle(self):
    length = int(self.headers.get("Content-Length") or 0)
    body = json.loads(self.rfile.read(length)) if length else None
    with self.server.lock:
      self.server.seen.append((self.command, self.path, dict(self.headers)))
    try:
      self.server.answer(self, body)
    except OSError:  # the client gave up (a deadline test)
      pass

  do_GET = do_POST = _handle  # noqa: N815

  def log_message(self, *args):
    pass

  def reply(self, status, payload, headers=()):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    self.send_response(status)
    for name, value in (("Content-Type", "application/json"),
                        ("Content-Length", str(len(data))), *headers):
      self.send_header(name, value)
    self.end_headers()
    self.wfile.write(data)


@pytest.fixture
def serve():
  """serve(answer) -> (base URL, the list of requests it saw); all shut down afterwards."""
  servers = []

  def start(answer):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.answer, server.seen, server.lock = answer, [], threading.Lock()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    servers.append(server)
    return f"http://127.0.0.1:{server.server_address[1]}", server.seen
  yield start
  for server in servers:
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
  for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
    monkeypatch.delenv(name, raising=False)


def _trickle_body(handler, body):  # noqa: ARG001
  """200 OK with a Content-Length of 1000, then one byte every 0.3 s: each read gets a byte
  well within any socket timeout, the answer never completes."""
  handler.send_response(200)
  handler.send_header("Content-Length", "1000")
  handler.end_headers()
  for _ in range(1000):
    handler.wfile.write(b" ")
    handler.wfile.flush()
    time.sleep(0.3)


def _trickle_headers(handler, body):  # noqa: ARG001
  for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 1000:
    handler.wfile.write(bytes([byte]))
    handler.wfile.flush()
    time.sleep(0.1)


@pytest.mark.parametrize("answer", [_trickle_body, _trickle_headers])
def test_a_trickling_server_fails_at_the_deadline(serve, answer):
  url, seen = serve(answer)
  start = time.monotonic()
  with pytest.raises(DeadlineExceeded):
    fetch("POST", f"{url}/score", b"{}", timeout_s=0.6)
  assert 0.5 < time.monotonic() - start < 1.5 and len(seen) == 1


def test_a_trickling_reward_server_is_an_outage_within_its_deadline(serve):
  url, seen = serve(_trickle_body)
  cfg = RemoteRewardConfig(url=f"{url}/score", name="judge", timeout_s=1.0, max_retries=0)
  start = time.monotonic()
  result = score_remote(cfg, ["q"], ["p"], [0])
  assert time.monotonic() - start < 2.0 and result.failed.all() and len(seen) == 1
  with pytest.raises(RemoteOutage) as info:
    raise_first(result)
  assert isinstance(info.value, RunStopped)
  assert str(info.value) == (
      f"remote reward 'judge' at {url}/score: timed out after 1 s (1 attempt) on row 0; restart "
      f"or fix the server, or give it longer with its reward.remote entry's timeout_s (now 1), "
      f"max_retries (now 0), backoff_s (now 0.5).")


def test_a_down_reward_server_is_an_outage_after_its_retries(serve):
  url, seen = serve(lambda handler, body: handler.reply(503, {"error": "down"}))
  cfg = RemoteRewardConfig(url=f"{url}/score", timeout_s=1.0, max_retries=2, backoff_s=0.01)
  with pytest.raises(RemoteOutage) as info:
    raise_first(score_remote(cfg, ["q", "r"], ["p", "p"], [0, 1]))
  message = str(info.value)
  assert len(seen) == 3 and "\n" not in message
  assert message.startswith(f"remote reward 'remote' at {url}/score: answered HTTP 503 (3 "
                            f"attempts in ")
  assert "on rows 0-1; restart or fix the server" in message
  assert message.endswith("max_retries (now 2), backoff_s (now 0.01).")


def test_no_redirect_is_followed_so_no_credential_leaves(serve):
  other, stolen = serve(lambda handler, body: handler.reply(200, {"rewards": [1.0]}))
  url, seen = serve(lambda handler, body: handler.reply(
      302, b"", (("Location", f"{other}/stolen"), ("Set-Cookie", "a=b"))))
  cfg = RemoteRewardConfig(url=f"{url}/score", max_retries=3, backoff_s=0.01,
                           headers=(("Authorization", "Bearer SECRET-TOKEN"),
                                    ("Cookie", "session=SECRET")))
  result = score_remote(cfg, ["q"], ["p"], [0])
  assert stolen == [] and len(seen) == 1  # not followed, not retried
  assert seen[0][2]["Authorization"] == "Bearer SECRET-TOKEN"  # the configured server has it
  (error,) = result.errors
  assert error == (f"remote reward 'remote' at {url}/score: answered HTTP 302 redirecting to "
                   f"'{other}/stolen', which is not followed (it would carry the request's "
                   f"headers elsewhere); set the URL to the endpoint itself; row 0 scored 0")
  with pytest.raises(RewardError) as info:  # an answer that will not change: not an outage
    raise_first(result)
  assert not isinstance(info.value, RemoteOutage) and "SECRET" not in str(info.value)


def test_the_proxy_of_the_environment_is_used(serve, monkeypatch):
  proxy, seen = serve(lambda handler, body: handler.reply(200, {"via": "proxy"}))
  monkeypatch.setenv("http_proxy", proxy.replace("http://", "http://me:pw@"))
  monkeypatch.setenv("no_proxy", "")
  assert fetch("GET", "http://reward.invalid:8000/score?x=1", timeout_s=2) == b'{"via": "proxy"}'
  ((method, path, headers),) = seen
  assert (method, path) == ("GET", "http://reward.invalid:8000/score?x=1")
  assert headers["Proxy-Authorization"] == "Basic bWU6cHc="  # me:pw
  monkeypatch.setenv("no_proxy", "127.0.0.1")  # listed: straight to the server
  direct, own = serve(lambda handler, body: handler.reply(404, b"none here"))
  with pytest.raises(HttpStatus) as info:
    fetch("GET", f"{direct}/x", timeout_s=2)
  assert (info.value.status, info.value.body) == (404, b"none here")
  assert len(seen) == 1 and len(own) == 1


# ----------------------------------------------------------------------------- the teacher


def _teacher_server(serve, logprobs):
  """A teacher: /info of a 16-token vocabulary, /logprobs answered by logprobs(completions)
  (a value, or a callable taking the handler)."""
  def answer(handler, body):
    if handler.path == "/info":
      return handler.reply(200, {"vocab_size": 16, "vocab_sha256": None})
    if callable(logprobs):
      return logprobs(handler, body)
    return handler.reply(200, {"logprobs": [[logprobs] * len(c) for c in body["completion_ids"]]})
  return serve(answer)


def _ask(url, **settings):
  """The teacher at url's log-probs of 2 completions (3 and 1 tokens) of one prompt."""
  teacher = RemoteTeacher.connect(url, _Tokenizer(), 16, **{"backoff_s": 0.01, **settings})
  prompts = types.SimpleNamespace(prompt_tokens=np.array([[0, 5]]), prompt_mask=np.ones((1, 2)))
  return teacher.logprobs(prompts, np.array([[1, 2, 3], [4, 0, 0]]),
                          np.array([[1, 1, 1], [1, 0, 0]]), 2)


class _Tokenizer:
  def __len__(self):
    return 16


def test_a_teachers_logprobs_and_token(serve, monkeypatch):
  url, seen = _teacher_server(serve, -0.5)
  monkeypatch.setenv("MY_TEACHER_TOKEN", "tok-123")
  teacher = RemoteTeacher.connect(url, _Tokenizer(), 16, "MY_TEACHER_TOKEN")
  assert teacher.cfg.url == f"{url}/logprobs" and teacher.cfg.timeout_s == 60
  np.testing.assert_array_equal(_ask(url), [[-0.5, -0.5, -0.5], [-0.5, 0, 0]])
  assert seen[0][2]["Authorization"] == "Bearer tok-123"
  assert "Authorization" not in seen[-1][2]  # no token_env: none sent


@pytest.mark.parametrize("value,words", [
    (1e6, "answered the log-prob 1000000.0 for row 0 token 0, above 0 (a log-probability is at "
          "most 0: logits or probabilities were sent)"),
    ("x", 'answered a log-prob that is not a number, "x", for row 0 token 0'),
    (None, "answered a log-prob that is not a number, null, for row 0 token 0"),
    (True, "answered a log-prob that is not a number, true, for row 0 token 0"),
])
def test_impossible_teacher_logprobs_are_one_sentence(serve, value, words):
  url, seen = _teacher_server(serve, value)
  with pytest.raises(RewardError) as info:
    _ask(url)
  assert str(info.value) == (
      f"the distillation teacher at {url}/logprobs, asked for rows 0-1, {words}; fix its "
      f"server: it must answer {{\"logprobs\": [[...], ...]}} with one log-prob <= 0 per "
      f"completion token, as python -m grpo_jax.serve_teacher does.")
  assert len(seen) == 2  # /info, one /logprobs: a wrong answer is not retried


def test_teacher_logprobs_within_rounding_nan_and_the_wrong_count(serve):
  np.testing.assert_array_equal(_ask(_teacher_server(serve, 1e-4)[0])[0], [np.float32(1e-4)] * 3)
  assert np.isnan(_ask(_teacher_server(serve, float("nan"))[0])[0]).all()  # fails its row later
  url, _ = _teacher_server(serve, lambda handler, body: handler.reply(
      200, {"logprobs": [[-1.0], [-1.0]]}))
  with pytest.raises(RewardError, match=r"without one log-prob per completion token of each row "
                                        r"\(1 log-probs for row 0's 3 tokens\)"):
    _ask(url)


def test_a_down_teacher_is_an_outage_after_its_retries(serve):
  url, seen = _teacher_server(serve, lambda handler, body: handler.reply(503, {"error": "down"}))
  with pytest.raises(RemoteOutage) as info:
    _ask(url, max_retries=2)
  message = str(info.value)
  assert len(seen) == 4 and "\n" not in message  # /info, then 3 attempts
  assert message.startswith(f"the distillation teacher at {url}/logprobs, asked for rows 0-1, "
                            f"answered HTTP 503 (3 attempts in ")
  assert message.endswith("; restart it, or give it longer with rl.distill_teacher_timeout_s "
                          "(now 60), rl.distill_teacher_max_retries (now 2), "
                          "rl.distill_teacher_backoff_s (now 0.01).")


def test_a_trickling_teacher_is_an_outage_within_its_deadline(serve):
  url, _ = _teacher_server(serve, _trickle_body)
  start = time.monotonic()
  with pytest.raises(RemoteOutage, match=r"asked for rows 0-1, timed out after 0\.5 s \(2 "
                                         r"attempts in 1\.\d s\); restart it"):
    _ask(url, timeout_s=0.5, max_retries=1)
  assert time.monotonic() - start < 2.0


class _Interrupt(BaseException):
  """What a run's signal handler raises in a host wait (grpo_jax/interrupts.py)."""


def test_an_interrupt_leaves_at_once_and_cuts_the_requests_in_flight(serve):
  url, _ = _teacher_server(serve, _trickle_body)

  def interrupt(signum, frame):  # noqa: ARG001
    raise _Interrupt
  previous = signal.signal(signal.SIGALRM, interrupt)
  start = time.monotonic()
  try:
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(_Interrupt):
      _ask(url, timeout_s=30.0, max_retries=3)
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
  assert time.monotonic() - start < 1.0  # not the 30 s deadline, nor the pool's requests
  time.sleep(0.2)
  assert not [t for t in threading.enumerate() if t.name.startswith("teacher")]


def test_the_first_chunk_to_fail_in_time_is_raised_at_once_and_the_rest_abandoned():
  """Chunk 0 is still in its retries (a backoff wait) when chunk 1 fails for good: chunk 1's
  outage is raised at once, chunk 0 abandoned; when all succeed, the results keep item order."""
  left = []

  def call(item, abandon):
    if item == 0:
      try:
        abandon.wait(5.0)  # a backoff between retries: ends when the caller leaves
      except Abandoned:
        left.append(item)
        raise
      raise RemoteOutage("chunk 0 is down")
    raise RemoteOutage(f"chunk {item} is down")
  start = time.monotonic()
  with pytest.raises(RemoteOutage, match="^chunk 1 is down$"):
    map_abandoning(call, [0, 1], 2, "test-pool")
  assert time.monotonic() - start < 1.0
  time.sleep(0.1)
  assert left == [0]
  slow_first = lambda item, abandon: time.sleep(0.1 * (3 - item)) or item  # noqa: E731
  assert map_abandoning(slow_first, range(3), 3, "test-pool") == [0, 1, 2]


def test_teacher_settings_are_checked_without_echoing_a_password():
  problem = settings_problem("http://alice:s3cret@127.0.0.1:18431", 60.0, 5, 1.0)
  assert problem == ("rl.distill_teacher='http://127.0.0.1:18431' has a user:password@ part, "
                     "which is not sent; remove it and give a token with "
                     "rl.distill_teacher_token_env (the name of an environment variable holding "
                     "it) if the teacher's server needs one.")
  assert settings_problem("http://127.0.0.1:1", 0, 5, 1.0).startswith(
      "rl.distill_teacher_timeout_s=0 must be a positive number of seconds")
  assert settings_problem("http://127.0.0.1:1", 60.0, -1, 1.0).startswith(
      "rl.distill_teacher_max_retries=-1 must be an integer of 0 or more")
  assert settings_problem("http://127.0.0.1:1", 60.0, 5, -2.0).startswith(
      "rl.distill_teacher_backoff_s=-2.0 must be a number of 0 or more")
  assert settings_problem("http://127.0.0.1:1", 60.0, 5, 1.0) is None
  with pytest.raises(ConfigError) as info:  # also when connecting directly, before a request
    RemoteTeacher.connect("http://alice:s3cret@127.0.0.1:1", _Tokenizer())
  assert "s3cret" not in str(info.value)


def test_config_validation_refuses_a_teacher_url_with_a_password():
  from grpo_jax.config import validate
  from tests.fixtures import small_tiny_config
  config = small_tiny_config(steps=1)
  config.rl.update(dict(distill_teacher="http://alice:s3cret@127.0.0.1:18431", distill_coef=1.0))
  with pytest.raises(ConfigError, match="^rl.distill_teacher='http://127.0.0.1:18431' has a "
                                        "user:password@ part") as info:
    validate(config)
  assert "s3cret" not in str(info.value)
  config.rl.update(dict(distill_teacher="http://127.0.0.1:18431", distill_teacher_max_retries=-1))
  with pytest.raises(ConfigError, match="^rl.distill_teacher_max_retries=-1 must be"):
    validate(config)
