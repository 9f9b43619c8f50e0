"""A frozen teacher's per-token log-probs over HTTP, for on-policy distillation from another
machine (rl.distill_teacher = "http://HOST:PORT"; the protocol is in
grpo_jax/rewards/remote_teacher.py):

    GRPO_JAX_TEACHER_TOKEN=... python -m grpo_jax.serve_teacher --model DIR [--port 8000]

DIR is any Hugging Face causal LM folder grpo_jax loads. Requests are padded to power-of-two
rows, prompt and completion widths (at least 8), so a server compiles a few shapes and then
reuses them; one forward runs at a time.

Who may ask (docs/security.md): it listens on 127.0.0.1 unless --host says otherwise. With a
token (the environment variable GRPO_JAX_TEACHER_TOKEN, or what --token_file holds; never a
flag's value, which every user of the machine sees in the process list) every request needs
`Authorization: Bearer TOKEN` (compared in constant time), else 401; a client run sets
rl.distill_teacher_token_env to the name of the variable that holds it. Binding another
address without a token prints a warning.

What one request may cost, checked before its body is read or anything is computed (413, or
400 for a malformed body, each with a one-line JSON {"error": ...}): a Content-Length is
required and at most --max_body_bytes; at most --max_rows rows; each row's prompt + completion
at most --max_row_tokens tokens (default: the model's max_position_embeddings, or
DEFAULT_ROW_TOKENS without one); the padded batch, rows x (prompt + completion width), at most
--max_request_tokens tokens, which with the row cap bounds the memory of a forward (it grows
as rows x length^2: the defaults let one request take ~20 GB with a tiny model of 4096
positions; lower them on a smaller machine). A forward that still runs out of memory answers
413 and the server goes on; a connection that sends nothing for READ_TIMEOUT_S seconds is
closed.

Standard library HTTP (ThreadingHTTPServer), no TLS: across a network, put it behind a TLS
proxy or an SSH tunnel, since a token sent over plain HTTP can be read on the way.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import ipaddress
import json
import os
import pathlib
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from grpo_jax.errors import ConfigError, InputError, first_line

TOKEN_ENV = "GRPO_JAX_TEACHER_TOKEN"
DEFAULT_ROW_TOKENS = 4096  # a row's cap when the model's config.json gives no positions
READ_TIMEOUT_S = 60.0  # per read of a request; a stalled client's thread is let go after it
ROUTES = "GET /info or POST /logprobs"


def _bucket(n: int) -> int:
  return max(8, 1 << max(int(n) - 1, 0).bit_length())


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


def _is_id(value, vocab_size: int) -> bool:
  return type(value) is int and 0 <= value < vocab_size  # not a bool, not a float


class Teacher:
  """The model of `model_dir`, its jitted completion log-probs and its /info."""

  def __init__(self, model_dir: str, compute_dtype: str = "float32"):
    import jax  # noqa: PLC0415

    from grpo_jax.models.hf import load_hf_checkpoint  # noqa: PLC0415
    from grpo_jax.models.scoring import completion_logprobs  # noqa: PLC0415
    from grpo_jax.rewards.remote_teacher import vocab_digest  # noqa: PLC0415
    self.cfg, self.params = load_hf_checkpoint(model_dir, "float32", compute_dtype)
    cfg = self.cfg
    self.fn = jax.jit(lambda p, pt, pm, t, tm: completion_logprobs(p, cfg, pt, pm, t, tm)[0])
    folder = pathlib.Path(model_dir)
    tokenizer = None
    if any((folder / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer.model")):
      from transformers import AutoTokenizer  # noqa: PLC0415
      try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
      except (OSError, ValueError, KeyError) as e:
        raise InputError(f"--model {model_dir}: its tokenizer files cannot be loaded "
                         f"({first_line(e)}); copy the model's tokenizer files again.") from None
    self.info = {"vocab_size": cfg.vocab_size,
                 "vocab_sha256": vocab_digest(tokenizer) if tokenizer is not None else None}
    self.lock = threading.Lock()

  def row_tokens(self, limits: Limits) -> int:
    """The most tokens (prompt + completion) one row may have."""
    return limits.max_row_tokens or self.cfg.max_position_embeddings or DEFAULT_ROW_TOKENS

  def check(self, request, limits: Limits = Limits()) -> tuple | None:
    """(HTTP status, why) for a /logprobs request body that is malformed (400) or over the
    limits (413), else None; sizes are checked before the ids are looked at."""
    if not isinstance(request, dict):
      return 400, "the body must be a JSON object"
    p, c = request.get("prompt_ids"), request.get("completion_ids")
    if (not isinstance(p, list) or not isinstance(c, list) or len(p) != len(c) or not p or
        not all(isinstance(row, list) for row in p + c)):
      return 400, ("prompt_ids and completion_ids must be lists of as many rows (lists, at least "
                   "one)")
    if len(p) > limits.max_rows:
      return 413, (f"{len(p)} rows, over this server's --max_rows={limits.max_rows}; send fewer "
                   f"rows per request or start it with a larger --max_rows")
    lengths = [len(a) + len(b) for a, b in zip(p, c)]
    row_cap, longest = self.row_tokens(limits), max(lengths)
    if longest > row_cap:
      return 413, (f"row {lengths.index(longest)} has {longest} tokens (prompt + completion), "
                   f"over this server's {row_cap} (--max_row_tokens; default the model's "
                   f"max_position_embeddings); send shorter rows")
    padded = _bucket(len(p)) * (_bucket(max(map(len, p))) + _bucket(max(map(len, c))))
    if padded > limits.max_request_tokens:
      return 413, (f"the request pads to {padded} tokens (rows x prompt and completion widths, "
                   f"each rounded up to a power of two), over this server's "
                   f"--max_request_tokens={limits.max_request_tokens}; send fewer or shorter "
                   f"rows or start it with a larger --max_request_tokens")
    if not all(_is_id(i, self.cfg.vocab_size) for row in p + c for i in row):
      return 400, f"every row must be a list of token ids in [0, {self.cfg.vocab_size})"
    if any(not row for row in p):
      return 400, "every prompt needs at least one token"
    return None

  def logprobs(self, prompt_ids: list, completion_ids: list) -> list:
    rows = _bucket(len(prompt_ids))
    width = _bucket(max(len(r) for r in prompt_ids))
    n = _bucket(max(len(r) for r in completion_ids))
    pt, pm = np.zeros((rows, width), np.int32), np.zeros((rows, width), bool)
    ct, cm = np.zeros((rows, n), np.int32), np.zeros((rows, n), bool)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
      pt[i, width - len(p):], pm[i, width - len(p):] = p, True  # left-padded prompts
      ct[i, :len(c)], cm[i, :len(c)] = c, True
    pm[len(prompt_ids):, -1] = True  # padding rows: one token, so that nothing is all-masked
    with self.lock:
      out = np.asarray(self.fn(self.params, pt, pm, ct, cm))
    return [out[i, :len(c)].tolist() for i, c in enumerate(completion_ids)]


def authorized(header: str | None, token: str | None) -> bool:
  """Whether an Authorization header carries `Bearer token` (always, without a token);
  compared in constant time, so its timing tells nothing about the token."""
  if token is None:
    return True
  given = (header or "").encode("utf-8", "surrogateescape")
  return hmac.compare_digest(given, f"Bearer {token}".encode())


class Handler(BaseHTTPRequestHandler):
  """GET /info and POST /logprobs of self.server (a TeacherServer)."""
  timeout = READ_TIMEOUT_S

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
    self.close_connection = True  # the body, if any, is not read: nothing more on this socket
    self._send(status, {"error": error})

  def _authorized(self) -> bool:
    if authorized(self.headers.get("Authorization"), self.server.token):
      return True
    self._refuse(401, "this teacher needs the header Authorization: Bearer TOKEN (the client: "
                      "rl.distill_teacher_token_env names the environment variable holding it)")
    return False

  def do_GET(self):  # noqa: N802
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
      request = json.loads(self.rfile.read(length))
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
  """The HTTP server: its teacher (set after the port is bound), token and limits."""
  daemon_threads = True

  def __init__(self, address, token: str | None, limits: Limits, teacher=None):
    self.teacher, self.token, self.limits = teacher, token, limits
    if ":" in address[0]:  # an IPv6 address, e.g. ::1
      self.address_family = socket.AF_INET6
    super().__init__(address, Handler)

  def handle_error(self, request, client_address) -> None:
    """One line on stderr for a request that broke its handler (no traceback per request)."""
    error = sys.exc_info()[1]
    print(f"error: a request from {client_address[0]} failed: {first_line(error)}",
          file=sys.stderr, flush=True)


def make_server(teacher: Teacher | None, host: str = "127.0.0.1", port: int = 8000,
                token: str | None = None, limits: Limits = Limits()) -> TeacherServer:
  """A server answering GET /info and POST /logprobs (port 0: any free port); InputError, one
  sentence, when the address cannot be bound."""
  try:
    return TeacherServer((host, port), token, limits, teacher)
  except OSError as e:
    raise InputError(f"cannot listen on {host}:{port} ({first_line(e)}); pass a free --port "
                     f"(0 picks one) or another --host.") from None


def read_token(token_file: str | None, environ=os.environ) -> str | None:
  """The token the server requires: what token_file holds or $GRPO_JAX_TEACHER_TOKEN (one of
  them; surrounding whitespace dropped), or None; InputError for an unreadable, empty or
  unsendable one."""
  text = environ.get(TOKEN_ENV) or None
  if token_file and text:
    raise InputError(f"both --token_file and ${TOKEN_ENV} are set; give the token one way.")
  where = f"--token_file {token_file}" if token_file else f"${TOKEN_ENV}"
  if token_file:
    try:
      text = pathlib.Path(token_file).read_text()
    except (OSError, UnicodeDecodeError) as e:
      raise InputError(f"{where} cannot be read ({first_line(e)}); write the token into a file "
                       f"only you can read (chmod 600).") from None
  if text is None:
    return None
  token = text.strip()
  if not token or not token.isascii() or not token.isprintable() or " " in token:
    raise InputError(f"{where} holds no usable token (one word of printable ASCII, e.g. what "
                     f"python -c 'import secrets; print(secrets.token_urlsafe())' prints).")
  return token


def is_loopback(host: str) -> bool:
  """Whether `host` reaches this machine only (127.x, ::1, localhost)."""
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def _count(text: str) -> int:
  value = int(text)
  if value < 0:
    raise argparse.ArgumentTypeError(f"{text} is negative")
  return value


def _port(text: str) -> int:
  value = _count(text)
  if value > 65535:
    raise argparse.ArgumentTypeError(f"{text} is not a port (0 to 65535)")
  return value


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m grpo_jax.serve_teacher",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--model", required=True, help="a Hugging Face causal LM folder")
  parser.add_argument("--host", default="127.0.0.1",
                      help="the address to listen on (default 127.0.0.1: this machine only)")
  parser.add_argument("--port", type=_port, default=8000, help="0: any free port")
  parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--token_file", default=None,
                      help=f"a file holding the token requests must carry (or set "
                           f"${TOKEN_ENV}); never put the token itself on the command line")
  defaults = Limits()
  parser.add_argument("--max_body_bytes", type=_count, default=defaults.max_body_bytes)
  parser.add_argument("--max_rows", type=_count, default=defaults.max_rows)
  parser.add_argument("--max_row_tokens", type=_count, default=defaults.max_row_tokens,
                      help="0: the model's max_position_embeddings "
                           f"({DEFAULT_ROW_TOKENS} without one)")
  parser.add_argument("--max_request_tokens", type=_count, default=defaults.max_request_tokens,
                      help="padded rows x (prompt + completion width) of one request")
  return parser.parse_args(argv)


def serve(args: argparse.Namespace) -> TeacherServer:
  """The bound server with its teacher loaded (the port first: a taken port fails at once,
  not after loading the model); ConfigError, one sentence, for what the user fixes."""
  token = read_token(args.token_file)
  limits = Limits(args.max_body_bytes, args.max_rows, args.max_row_tokens,
                  args.max_request_tokens)
  server = make_server(None, args.host, args.port, token, limits)
  try:
    server.teacher = Teacher(args.model, args.compute_dtype)
  except BaseException:
    server.server_close()
    raise
  return server


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    server = serve(args)
  except ConfigError as e:
    print(f"error: {' '.join(str(e).splitlines())}", file=sys.stderr)
    return 2
  teacher, port = server.teacher, server.server_address[1]
  if server.token is None and not is_loopback(args.host):
    print(f"warning: listening on {args.host} without a token: anyone who can reach port {port} "
          f"can use this teacher; set ${TOKEN_ENV} or --token_file (docs/security.md).",
          file=sys.stderr, flush=True)
  host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address in a URL
  print(f"serving the teacher {args.model} (vocab {teacher.info['vocab_size']}, rows of at most "
        f"{teacher.row_tokens(server.limits)} tokens, "
        f"{'a token required' if server.token else 'no token'}) at http://{host}:{port}",
        flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
