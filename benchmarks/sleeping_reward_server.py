"""A local HTTP reward server that is slow on purpose: it sleeps `sleep_s` seconds per request,
then answers the true reward of the tiny addition task (configs/grpo_tiny.py) for each row.

It speaks grpo_jax/rewards/remote.py's schema: a POST of
{"queries": [prompt + completion, ...], "prompts": [prompt, ...], "labels": [gold answer, ...]}
is answered {"rewards": [number, ...]}, one per row, in order. Requests are served concurrently
(the standard library's ThreadingHTTPServer: one thread per request), so k requests in flight
take about sleep_s in all, not k * sleep_s.

The reward is the task's own rule reward: each row's completion (the query after its prompt) and
label are turned into the addition task's token ids and scored by
grpo_jax.rewards.exact_match.exact_match_reward. Text loses tokens the task's decode drops
(<bos>, <pad>, ids past the alphabet, and whether <eos> ended the completion), so the benchmark's
config runs the task "addition_lossless" (benchmarks/lossless_addition.py), whose completions are
written with every sampled token, specials as <pad> <bos> <eos> <id:N> (`lossless_text`): read
back by `text_tokens`, the server's reward equals the rule reward on every row, and a run scored
by it learns exactly as with reward.rule_weight=1 (a completion text without <eos>, as the plain
"addition" task writes them, is closed by one).

    python benchmarks/sleeping_reward_server.py [--port 8000] [--sleep_s 2.0]

serves http://127.0.0.1:PORT/ until interrupted; benchmarks/async_overlap.py starts one in a
thread with `running_server(sleep_s)`.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script from anywhere
  sys.path.insert(0, ROOT)
from grpo_jax.data.tokenizer import CharTokenizer, pad_rows  # noqa: E402
from grpo_jax.rewards.exact_match import exact_match_reward  # noqa: E402

ADDITION_TOKENIZER = CharTokenizer("0123456789+=")  # grpo_jax/data/arithmetic.py's alphabet
SPECIAL_NAMES = {CharTokenizer.pad_id: "<pad>", CharTokenizer.bos_id: "<bos>",
                 CharTokenizer.eos_id: "<eos>"}


def lossless_text(ids, tokenizer: CharTokenizer = ADDITION_TOKENIZER) -> str:
  """Every id as text: an alphabet character, <pad> <bos> <eos>, or <id:N> for any other id."""
  alphabet, offset = tokenizer.alphabet, len(SPECIAL_NAMES)
  return "".join(SPECIAL_NAMES.get(i) or (alphabet[i - offset] if offset <= i < offset +
                                          len(alphabet) else f"<id:{i}>") for i in ids)


def text_tokens(text: str, tokenizer: CharTokenizer = ADDITION_TOKENIZER) -> list[int] | None:
  """The ids `lossless_text` wrote (the inverse), closed by <eos> when they hold none (a plain
  decoded text); None for text that is neither."""
  by_name = {name: i for i, name in SPECIAL_NAMES.items()}
  ids, i = [], 0
  while i < len(text):
    if text[i] == "<":
      end = text.find(">", i)
      name = text[i:end + 1] if end > 0 else ""
      if name in by_name:
        ids.append(by_name[name])
      elif name.startswith("<id:") and name[4:-1].isdigit():
        ids.append(int(name[4:-1]))
      else:
        return None
      i = end + 1
    elif text[i] in tokenizer.alphabet:
      ids.append(tokenizer.alphabet.index(text[i]) + len(SPECIAL_NAMES))
      i += 1
    else:
      return None
  return ids if tokenizer.eos_id in ids else ids + [tokenizer.eos_id]


def addition_rewards(queries: list, prompts: list, labels: list,
                     tokenizer: CharTokenizer = ADDITION_TOKENIZER) -> list[float]:
  """Per row: exact_match_reward(text_tokens(completion), text_tokens(label)), the completion
  being query[len(prompt):]. A row whose query does not start with its prompt, or whose text
  does not read, scores 0."""
  completions, targets = [], []
  for query, prompt, label in zip(queries, prompts, labels):
    ok = isinstance(query, str) and isinstance(prompt, str) and query.startswith(prompt)
    completion = text_tokens(query[len(prompt):], tokenizer) if ok else None
    target = text_tokens(str(label), tokenizer)
    if completion is None or target is None:
      completion, target = [tokenizer.pad_id], [tokenizer.eos_id]  # never equal: scores 0
    completions.append(completion)
    targets.append(target)
  if not completions:
    return []
  width = max(len(r) for r in completions + targets)
  tokens, mask = pad_rows(completions, width, tokenizer.pad_id, left=False)
  target_tokens, target_mask = pad_rows(targets, width, tokenizer.pad_id, left=False)
  return np.asarray(exact_match_reward(tokens, mask, target_tokens, target_mask)).tolist()


def request_problem(body) -> str | None:
  """Why a decoded request body does not follow the schema; None if it does."""
  if not isinstance(body, dict):
    return "the body must be a JSON object"
  lists = [body.get(key) for key in ("queries", "prompts", "labels")]
  if not all(isinstance(value, list) for value in lists):
    return 'the body needs lists "queries", "prompts" and "labels"'
  if len({len(value) for value in lists}) != 1:
    return '"queries", "prompts" and "labels" must have the same length'
  return None


class _Handler(http.server.BaseHTTPRequestHandler):
  """POST: sleep, then the rewards (400 with a one-line reason for a body off the schema)."""

  def do_POST(self):  # noqa: N802  (http.server's name)
    server = self.server
    started = time.monotonic()
    try:
      body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
    except ValueError as e:
      return self._answer(400, {"error": f"malformed JSON: {e}"})
    problem = request_problem(body)
    if problem:
      return self._answer(400, {"error": problem})
    time.sleep(server.sleep_s)
    rewards = addition_rewards(body["queries"], body["prompts"], body["labels"])
    with server.lock:
      server.spans.append((started, time.monotonic(), len(rewards)))
    return self._answer(200, {"rewards": rewards})

  def _answer(self, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)
    except OSError:  # the client left (its deadline passed)
      pass

  def log_message(self, *args):  # quiet: the benchmark prints its own lines
    pass


class SleepingRewardServer(http.server.ThreadingHTTPServer):
  """The server: `sleep_s` per request; `spans` records (start, end, rows) of each answered
  request (time.monotonic), under `lock`."""

  daemon_threads = True

  def __init__(self, sleep_s: float = 2.0, host: str = "127.0.0.1", port: int = 0):
    super().__init__((host, port), _Handler)
    self.sleep_s = sleep_s
    self.lock = threading.Lock()
    self.spans: list = []

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://{host}:{port}/score"


@contextlib.contextmanager
def running_server(sleep_s: float = 2.0, port: int = 0):
  """A SleepingRewardServer serving from a daemon thread (port 0: a free one), shut down on
  exit."""
  server = SleepingRewardServer(sleep_s, port=port)
  thread = threading.Thread(target=server.serve_forever, name="sleeping-reward-server",
                            daemon=True)
  thread.start()
  try:
    yield server
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--port", type=int, default=8000)
  parser.add_argument("--sleep_s", type=float, default=2.0)
  args = parser.parse_args()
  server = SleepingRewardServer(args.sleep_s, port=args.port)
  print(f"serving the addition reward at {server.url}, {args.sleep_s:g} s per request",
        flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


if __name__ == "__main__":
  main()
