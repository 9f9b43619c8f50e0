"""grpo_jax/serve_teacher.py as a service others can reach: the bearer token (401 without it),
the request limits checked before the body is read or anything computed (411, 413, 400 for
deep nesting), its command-line errors as one line with exit status 2, and the client's
rl.distill_teacher_token_env."""

import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest

from grpo_jax import serve_teacher
from grpo_jax.errors import ConfigError, InputError
from grpo_jax.serve_teacher import Limits, Teacher, make_server
from tests.test_distill import _student, _tiny_teacher

TOKEN = "s3cret-Token_42"
LIMITS = Limits(max_body_bytes=1 << 20, max_rows=4, max_row_tokens=32, max_request_tokens=256)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  return Teacher(_tiny_teacher(tmp_path_factory.mktemp("teacher")))


@pytest.fixture(scope="module")
def server(teacher):
  """A server of the tiny teacher on a free port, with TOKEN and LIMITS (a thread)."""
  server = make_server(teacher, port=0, token=TOKEN, limits=LIMITS)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield server
  server.shutdown()
  server.server_close()


def _ask(server, method, path, body=b"", headers=None, token=TOKEN):
  """(status, decoded JSON answer) of one request; body is sent as given (headers too)."""
  connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
  headers = dict(headers or {})
  if token is not None:
    headers["Authorization"] = f"Bearer {token}"
  if method == "POST" and "Content-Length" not in headers:
    headers["Content-Length"] = str(len(body))
  connection.putrequest(method, path, skip_accept_encoding=True)
  for name, value in headers.items():
    connection.putheader(name, value)
  connection.endheaders(body or None)
  response = connection.getresponse()
  answer = json.loads(response.read())
  connection.close()
  return response.status, answer


def _rows(prompts, completions):
  return json.dumps({"prompt_ids": prompts, "completion_ids": completions}).encode()


def test_the_token_is_required_and_a_good_request_answers(server, teacher):
  assert _ask(server, "GET", "/info", token=None)[0] == 401
  assert _ask(server, "GET", "/info", token=TOKEN + "x")[0] == 401
  status, answer = _ask(server, "POST", "/logprobs", _rows([[1]], [[2]]), token="wrong")
  assert status == 401 and "rl.distill_teacher_token_env" in answer["error"]
  assert _ask(server, "GET", "/info") == (200, teacher.info)
  status, answer = _ask(server, "POST", "/logprobs", _rows([[1, 2], [3]], [[4, 5, 6], [7]]))
  assert status == 200
  expected = teacher.logprobs([[1, 2], [3]], [[4, 5, 6], [7]])
  np.testing.assert_allclose(answer["logprobs"][0], expected[0], atol=1e-6)
  assert len(answer["logprobs"][1]) == 1


@pytest.mark.parametrize("prompts, completions, status, words", [
    ([[1]] * 5, [[2]] * 5, 413, "5 rows, over this server's --max_rows=4"),
    ([[1] * 3], [[2] * 30], 413, "row 0 has 33 tokens (prompt + completion), over this "
                                 "server's 32"),
    ([[1]] * 4, [[2] * 20] * 4, 413, "pads to 320 tokens"),
    ([[1]], [[True]], 400, "token ids in [0, 16)"),
    ([[1]], [[16]], 400, "token ids in [0, 16)"),
    ([[1]], [2], 400, "lists of as many rows")])
def test_requests_over_the_limits_or_malformed_are_refused(server, prompts, completions, status,
                                                          words):
  got, answer = _ask(server, "POST", "/logprobs", _rows(prompts, completions))
  assert got == status and words in answer["error"], answer


def test_a_large_body_refused_unread_still_reaches_the_client_as_its_status(server):
  """A body past --max_body_bytes, larger than the sockets' buffers: the client sending it reads
  the 413 sentence (the server reads and drops the rest), not a broken pipe reported as an
  outage; an unauthorised one reads its 401 likewise."""
  from grpo_jax.rewards.http_deadline import HttpStatus, fetch  # noqa: PLC0415
  url = f"http://127.0.0.1:{server.server_address[1]}/logprobs"
  body = b"[" + b"1," * (16 << 20) + b"1]"  # 32 MiB: past the sockets' buffers
  for token, status, words in ((TOKEN, 413, b"--max_body_bytes=1048576"),
                               ("wrong", 401, b"Authorization: Bearer TOKEN")):
    with pytest.raises(HttpStatus) as err:
      fetch("POST", url, body, (("Authorization", f"Bearer {token}"),), 30)
    assert err.value.status == status and words in err.value.body


def test_the_body_is_refused_before_it_is_read(server):
  """A declared 50 GB body: 413 at once, nothing allocated; no Content-Length: 411; a body
  nested 100,000 lists deep: 400, and the server still answers."""
  start = time.monotonic()
  status, answer = _ask(server, "POST", "/logprobs", b"[]",
                        headers={"Content-Length": "50000000000"})
  assert status == 413 and "--max_body_bytes=1048576" in answer["error"]
  assert time.monotonic() - start < 5
  assert _ask(server, "POST", "/logprobs", b"[]", headers={"Content-Length": "abc"})[0] == 400
  connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
  connection.putrequest("POST", "/logprobs")
  connection.putheader("Authorization", f"Bearer {TOKEN}")
  connection.endheaders()
  assert connection.getresponse().status == 411
  connection.close()
  status, answer = _ask(server, "POST", "/logprobs", b"[" * 100_000 + b"]" * 100_000)
  assert status == 400 and "nests lists deeper" in answer["error"]
  assert _ask(server, "GET", "/info")[0] == 200


def test_tokens_come_from_a_file_or_the_environment(tmp_path):
  read = serve_teacher.read_token
  assert read(None, {}) is None
  assert read(None, {"GRPO_JAX_TEACHER_TOKEN": TOKEN}) == TOKEN
  for empty in ("", "  \n"):  # set but empty: an error, not a server without authentication
    with pytest.raises(InputError, match=r"^\$GRPO_JAX_TEACHER_TOKEN holds no usable token"):
      read(None, {"GRPO_JAX_TEACHER_TOKEN": empty})
  file = tmp_path / "token"
  file.write_text(TOKEN + "\n")
  assert read(str(file), {}) == TOKEN
  for environ, words in (({"GRPO_JAX_TEACHER_TOKEN": "x"}, "both --token_file and"),
                         ({}, "no usable token")):
    if words == "no usable token":
      file.write_text("two words\n")
    with pytest.raises(InputError, match=words):
      read(str(file), environ)
  with pytest.raises(InputError, match="cannot be read"):
    read(str(tmp_path / "missing"), {})
  assert serve_teacher.is_loopback("127.0.0.1") and serve_teacher.is_loopback("::1")
  assert not serve_teacher.is_loopback("0.0.0.0") and not serve_teacher.is_loopback("10.1.2.3")


def test_a_missing_model_or_a_taken_port_is_one_line_with_status_2(tmp_path, capsys):
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    assert serve_teacher.main(["--model", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot listen on 127.0.0.1:{port}") and "\n" not in err
  assert serve_teacher.main(["--model", str(tmp_path / "nonexistent"), "--port", "0"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: No checkpoint directory at") and "\n" not in err


def test_the_client_sends_the_token_of_distill_teacher_token_env(server, monkeypatch, tmp_path):
  from grpo_jax.config import validate  # noqa: PLC0415
  from grpo_jax.rewards.remote_teacher import RemoteTeacher  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  url = f"http://127.0.0.1:{server.server_address[1]}"
  config = _student(url, distill_teacher_token_env="MY_TEACHER_TOKEN")
  monkeypatch.delenv("MY_TEACHER_TOKEN", raising=False)
  with pytest.raises(ConfigError, match="the environment has no MY_TEACHER_TOKEN; export"):
    validate(config)
  monkeypatch.setenv("MY_TEACHER_TOKEN", "part-one\npart-two")  # http.client printed it
  with pytest.raises(ConfigError, match=r"the token in \$MY_TEACHER_TOKEN has a line break") as e:
    validate(config)
  assert "part-" not in str(e.value)
  monkeypatch.setenv("MY_TEACHER_TOKEN", TOKEN)
  validate(config)
  tokenizer = build_task(config).tokenizer
  with pytest.raises(ConfigError, match="HTTP 401.*rl.distill_teacher_token_env"):
    RemoteTeacher.connect(url, tokenizer)
  remote = RemoteTeacher.connect(url, tokenizer, token_env="MY_TEACHER_TOKEN")
  from grpo_jax.rewards.http_deadline import Abandon  # noqa: PLC0415
  assert remote._chunk([[1]], [[2, 3]], 0, Abandon())[0] == pytest.approx(
      server.teacher.logprobs([[1]], [[2, 3]])[0], abs=1e-6)


def test_a_forward_out_of_memory_is_413_not_retried_and_other_faults_500():
  status, why = serve_teacher.forward_failure(
      RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 10085865984 bytes."))
  assert status == 413 and "--max_request_tokens" in why
  assert serve_teacher.forward_failure(ValueError("boom"))[0] == 500


def test_connections_past_the_cap_get_503_and_a_trickling_request_is_cut_at_its_deadline():
  """max_connections open at once: one more is answered 503 and closed, nothing read. A client
  sending its headers a byte at a time (each read well within READ_TIMEOUT_S) is cut off at
  read_deadline_s, and its slot is free again."""
  server = make_server(None, port=0, max_connections=2, read_deadline_s=1.0)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  port = server.server_address[1]
  try:
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    time.sleep(0.3)
    third = socket.create_connection(("127.0.0.1", port), timeout=10)
    assert third.recv(100).startswith(b"HTTP/1.1 503")
    third.close()
    started = time.monotonic()
    for b in b"GET /info HTTP/1.1\r\nHost: x":  # a trickle on one of the two held slots
      try:
        idle[0].sendall(bytes([b]))
      except OSError:
        break
      time.sleep(0.1)
    try:
      answer = idle[0].recv(100)
    except ConnectionResetError:
      answer = b""
    assert answer == b"" and time.monotonic() - started < 5  # cut at ~1 s
    for s in idle:
      s.close()
    time.sleep(1.5)  # the second idle connection's deadline frees its slot too
    status, answer = _ask(server, "GET", "/nowhere", token=None)
    assert status == 404 and "GET /info" in answer["error"]
  finally:
    server.shutdown()
    server.server_close()
