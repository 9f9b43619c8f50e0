"""A frozen teacher's per-token log-probs over HTTP, for on-policy distillation from another
machine (rl.distill_teacher = "http://HOST:PORT"; the protocol is in
grpo_jax/rewards/remote_teacher.py):

    python -m grpo_jax.serve_teacher --model DIR [--host 127.0.0.1] [--port 8000]

DIR is any Hugging Face causal LM folder grpo_jax loads. Requests are padded to power-of-two
rows, prompt and completion widths (at least 8), so a server compiles a few shapes and then
reuses them; one forward runs at a time. Standard library HTTP (ThreadingHTTPServer): put it
behind your own proxy for anything but a trusted network.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


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
      tokenizer = AutoTokenizer.from_pretrained(folder)
    self.info = {"vocab_size": cfg.vocab_size,
                 "vocab_sha256": vocab_digest(tokenizer) if tokenizer is not None else None}
    self.lock = threading.Lock()

  def check(self, request) -> str | None:
    """Why a /logprobs request body is malformed, else None."""
    if not isinstance(request, dict):
      return "the body must be a JSON object"
    p, c = request.get("prompt_ids"), request.get("completion_ids")
    if not isinstance(p, list) or not isinstance(c, list) or len(p) != len(c) or not p:
      return "prompt_ids and completion_ids must be lists of as many rows (at least one)"
    for row in p + c:
      if not isinstance(row, list) or not all(
          isinstance(i, int) and 0 <= i < self.cfg.vocab_size for i in row):
        return f"every row must be a list of token ids in [0, {self.cfg.vocab_size})"
    if any(not row for row in p):
      return "every prompt needs at least one token"
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


def make_server(teacher: Teacher, host: str = "127.0.0.1", port: int = 8000):
  """A ThreadingHTTPServer answering GET /info and POST /logprobs (port 0: any free port)."""

  class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, payload) -> None:
      body = json.dumps(payload).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def do_GET(self):  # noqa: N802
      if self.path.rstrip("/") == "/info":
        self._send(200, teacher.info)
      else:
        self._send(404, {"error": "GET /info or POST /logprobs"})

    def do_POST(self):  # noqa: N802
      if self.path.rstrip("/") != "/logprobs":
        self._send(404, {"error": "GET /info or POST /logprobs"})
        return
      try:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
      except ValueError:
        self._send(400, {"error": "the body is not JSON"})
        return
      problem = teacher.check(request)
      if problem:
        self._send(400, {"error": problem})
        return
      self._send(200, {"logprobs": teacher.logprobs(request["prompt_ids"],
                                                    request["completion_ids"])})

    def log_message(self, *args):  # quiet: one line per request would drown the console
      pass

  return ThreadingHTTPServer((host, port), Handler)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", required=True, help="a Hugging Face causal LM folder")
  parser.add_argument("--host", default="127.0.0.1")
  parser.add_argument("--port", type=int, default=8000)
  parser.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"])
  args = parser.parse_args(argv)
  teacher = Teacher(args.model, args.compute_dtype)
  server = make_server(teacher, args.host, args.port)
  print(f"serving the teacher {args.model} (vocab {teacher.info['vocab_size']}) at "
        f"http://{args.host}:{server.server_address[1]}", flush=True)
  server.serve_forever()


if __name__ == "__main__":
  main()
