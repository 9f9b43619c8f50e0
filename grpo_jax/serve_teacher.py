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
413 and the server goes on; a connection that sends nothing for 60 s, or has not sent its whole request
after 120 s, is closed; at most 64 connections are served at once (one more: 503).

Standard library HTTP (ThreadingHTTPServer), no TLS: across a network, put it behind a TLS
proxy or an SSH tunnel, since a token sent over plain HTTP can be read on the way.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import pathlib
import sys
import threading

import numpy as np

from grpo_jax.errors import ConfigError, InputError, first_line
from grpo_jax.teacher_http import Limits, TeacherServer, make_server
from grpo_jax.teacher_http import forward_failure  # noqa: F401  (re-exported)

TOKEN_ENV = "GRPO_JAX_TEACHER_TOKEN"
DEFAULT_ROW_TOKENS = 4096  # a row's cap when the model's config.json gives no positions


def _bucket(n: int) -> int:
  return max(8, 1 << max(int(n) - 1, 0).bit_length())


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
    # type(i) is int: a bool or a float is no token id
    if not all(type(i) is int and 0 <= i < self.cfg.vocab_size for row in p + c for i in row):
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


def read_token(token_file: str | None, environ=os.environ) -> str | None:
  """The token the server requires: what token_file holds or $GRPO_JAX_TEACHER_TOKEN (one of
  them; surrounding whitespace dropped), or None; InputError for an unreadable, empty or
  unsendable one."""
  text = environ.get(TOKEN_ENV)  # set but empty: an InputError below, not a server without one
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
