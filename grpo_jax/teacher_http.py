"""The teacher server's HTTP layer (python -m grpo_jax.serve_teacher): the routes, the bearer
token, what one request may cost (checked before its body is read), at most MAX_CONNECTIONS
connections at once, and a whole request read within READ_DEADLINE_S. The teacher itself (its
model, `check` and `logprobs`) is grpo_jax/serve_teacher.py's."""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from grpo_jax.errors import InputError, first_line

READ_TIMEOUT_S = 60.0  # per read of a request; a stalled client's thread is let go after it
READ_DEADLINE_S = 120.0  # a whole request's headers and body, however slowly they trickle in
MAX_CONNECTIONS = 64  # open at once; one more is answered 503 and closed
ROUTES = "GET /info or POST /logprobs"


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may hold (see the module docstring); 0 max_row_tokens: the model's."""
  max_body_bytes: int = 8 << 20
  max_rows: int = 256
  max_row_tokens: int = 0
  max_request_tokens: int = 1 << 19


def body_length(header: str | None, limit: int) -> tuple[int, tuple | None]:
  """(the body's length, None) from a Content-Length header, or (0, (status, error)) when it
  is missing, not a number or over `limit`: decided before a byte of the body is read."""
  if header is None:
    return 0, (411, "a POST needs a Content-Length header (chunked bodies are not read)")
  value = header.strip()
  if not (value.isascii() and value.isdigit()):
    return 0, (400, f"Content-Length {header[:40]!r} is not a number of bytes")
  if int(value) > limit:
    return 0, (413, f"the body is {int(value)} bytes, over this server's --max_body_bytes="
                    f"{limit}; start it with a larger --max_body_bytes")
  return int(value), None


def forward_failure(error: BaseException) -> tuple:
  """(HTTP status, why) of a forward that raised: out of memory is 413, since the same request
  would fail again (a client does not retry it), anything else 500."""
  if isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in str(error):
    return 413, (f"the teacher ran out of memory on this request ({first_line(error)}); send "
                 f"fewer or shorter rows, and lower the server's --max_request_tokens so that "
                 f"such requests are refused before they run")
  return 500, f"the teacher's forward failed: {first_line(error)}"


class Handler(BaseHTTPRequestHandler):
  """GET /info and POST /logprobs of self.server (a TeacherServer)."""
  timeout = READ_TIMEOUT_S

  def setup(self) -> None:
    """One request per connection, read within the server's read_deadline_s in all: a client
    trickling its headers or body a byte at a time is cut off then, not kept forever."""
    super().setup()
    self._unread = True  # the request's body (if any) not read yet
    self._deadline = threading.Timer(self.server.read_deadline_s, self._cut)
    self._deadline.daemon = True
    self._deadline.start()

  def _cut(self) -> None:
    with contextlib.suppress(OSError):
      self.connection.shutdown(socket.SHUT_RDWR)

  def _read_done(self) -> None:
    self._deadline.cancel()
    self._unread = False
    self.close_connection = True

  def finish(self) -> None:
    self._deadline.cancel()
    super().finish()

  def _send(self, status: int, payload) -> None:
    body = json.dumps(payload).encode()
    self.send_response(status)
    if status == 401:
      self.send_header("WWW-Authenticate", "Bearer")
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def _refuse(self, status: int, error: str) -> None:
    """The refusal, and nothing more on this socket. A body still unread (a POST refused on its
    headers) is read and dropped after the answer, within the read deadline: closing on it would
    reset the connection while the client still sends, and it would never read the answer."""
    self.close_connection = True
    self._send(status, {"error": error})
    if self._unread:
      with contextlib.suppress(OSError):
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_WR)
        while self.rfile.read1(1 << 16):
          pass

  def _authorized(self) -> bool:
    """Whether the Authorization header carries `Bearer token` (always, without a token),
    compared in constant time, so its timing tells nothing about the token; else a 401."""
    token = self.server.token
    given = (self.headers.get("Authorization") or "").encode("utf-8", "surrogateescape")
    if token is None or hmac.compare_digest(given, f"Bearer {token}".encode()):
      return True
    self._refuse(401, "this teacher needs the header Authorization: Bearer TOKEN (the client: "
                      "rl.distill_teacher_token_env names the environment variable holding it)")
    return False

  def do_GET(self):  # noqa: N802
    self._read_done()
    if not self._authorized():
      return
    if self.path.rstrip("/") == "/info":
      self._send(200, self.server.teacher.info)
    else:
      self._refuse(404, ROUTES)

  def do_POST(self):  # noqa: N802
    if not self._authorized():
      return
    if self.path.rstrip("/") != "/logprobs":
      self._refuse(404, ROUTES)
      return
    teacher, limits = self.server.teacher, self.server.limits
    length, refusal = body_length(self.headers.get("Content-Length"), limits.max_body_bytes)
    if refusal:
      self._refuse(*refusal)
      return
    try:
      body = self.rfile.read(length)
      self._read_done()
      request = json.loads(body)
    except RecursionError:
      self._refuse(400, "the body nests lists deeper than the JSON parser allows; send {"
                        "\"prompt_ids\": [[int, ...], ...], \"completion_ids\": [[int, ...], "
                        "...]}")
      return
    except ValueError:
      self._refuse(400, "the body is not JSON")
      return
    refusal = teacher.check(request, limits)
    if refusal:
      self._refuse(*refusal)
      return
    try:
      values = teacher.logprobs(request["prompt_ids"], request["completion_ids"])
    except Exception as e:  # noqa: BLE001  (out of memory and such: one line, the server goes on)
      print(f"error: a request of {len(request['prompt_ids'])} rows failed: {first_line(e)}",
            file=sys.stderr, flush=True)
      self._refuse(*forward_failure(e))
      return
    self._send(200, {"logprobs": values})

  def log_message(self, *args):  # quiet: one line per request would drown the console
    pass


class TeacherServer(ThreadingHTTPServer):
  """The HTTP server: its teacher (set after the port is bound), token and limits; at most
  max_connections handled at once (one more: 503 and closed, nothing read)."""
  daemon_threads = True

  def __init__(self, address, token: str | None, limits: Limits, teacher=None,
               max_connections: int = MAX_CONNECTIONS, read_deadline_s: float = READ_DEADLINE_S):
    self.teacher, self.token, self.limits = teacher, token, limits
    self.read_deadline_s = read_deadline_s
    self._slots = threading.BoundedSemaphore(max_connections)
    if ":" in address[0]:  # an IPv6 address, e.g. ::1
      self.address_family = socket.AF_INET6
    super().__init__(address, Handler)

  def process_request(self, request, client_address) -> None:
    if not self._slots.acquire(blocking=False):
      with contextlib.suppress(OSError):
        request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n")
      self.shutdown_request(request)
      return
    super().process_request(request, client_address)

  def process_request_thread(self, request, client_address) -> None:
    try:
      super().process_request_thread(request, client_address)
    finally:
      self._slots.release()

  def handle_error(self, request, client_address) -> None:
    """One line on stderr for a request that broke its handler (no traceback per request)."""
    error = sys.exc_info()[1]
    print(f"error: a request from {client_address[0]} failed: {first_line(error)}",
          file=sys.stderr, flush=True)


def make_server(teacher, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
                limits: Limits = Limits(), **server_options) -> TeacherServer:
  """A server answering GET /info and POST /logprobs (port 0: any free port); InputError, one
  sentence, when the address cannot be bound."""
  try:
    return TeacherServer((host, port), token, limits, teacher, **server_options)
  except OSError as e:
    raise InputError(f"cannot listen on {host}:{port} ({first_line(e)}); pass a free --port "
                     f"(0 picks one) or another --host.") from None
