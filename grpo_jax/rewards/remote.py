"""Rewards scored by an HTTP server (as OpenRLHF's --remote_rm_url), with the standard library.

score_remote(cfg, queries, prompts, labels) splits the rows into chunks of cfg.batch_size and
POSTs each chunk to cfg.url, at most cfg.max_concurrency chunks in flight at once (a thread
pool); the answers are joined back in row order, whatever order they arrive in.

Request: one POST per chunk, headers Content-Type: application/json (and cfg.headers, e.g. an
Authorization), body a JSON object of three lists of the chunk's rows, in row order:

    {"queries": [str, ...],   # per row: the prompt and its completion, as the policy saw them
     "prompts": [str, ...],   # per row: the prompt alone
     "labels":  [any, ...]}   # per row: the gold answer (any JSON value: str, number, null...)

Response: a 2xx status and a JSON body, either an object

    {"rewards": [number, ...],               # required: one per row of the request, in order
     "step_rewards": [[number, ...], ...]}   # optional: per row a list of per-step rewards
                                             # (or null for a row without any)

or a bare list of numbers (the rewards). Other keys are ignored. JSON's NaN and Infinity are
read (as Python's json reads them) and fail their row alone, as does a value beyond float32.

Deadline and retries, per chunk: each attempt must end within cfg.timeout_s seconds in all
(connect, send, and read the whole answer; grpo_jax/rewards/http_deadline.py), so a server that
trickles its answer fails at the deadline. A timeout, a connection error, HTTP 5xx and HTTP 429
are tried again, up to cfg.max_retries times after the first attempt, waiting
cfg.backoff_s * 2**k seconds (at most MAX_BACKOFF_S) before retry k (0, 1, ...). Answers that
would come out the same again are not retried: another HTTP status (4xx; a 3xx too: redirects
are not followed, so no header reaches another origin), malformed JSON, no "rewards", a number
of rewards other than the chunk's rows, or a value that is not a number.

Faults of the server never raise: the rows they touch score 0, are marked failed, and get one
error line (naming the reward, the URL and the reason) per failed chunk or row. The caller picks
what a failure does: raise_first(result) stops the run (train.on_reward_error='raise': a
RemoteOutage when a chunk's retries ran out, else a RewardError), or the failed rows are
counted (train.on_reward_error='zero'). Bad settings raise ConfigError before any request is
sent. Credentials go in cfg.headers (a user:password@ in the URL is refused), and header values
never appear in a message. docs/remote_services.md is the user's page.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import numbers
import time
from typing import NamedTuple

import numpy as np

from grpo_jax.errors import ConfigError, RemoteRewardOutage, RewardError, first_line
from grpo_jax.rewards.http_deadline import (Abandon, HttpStatus, fetch, map_abandoning,
                                            public_url, url_problem)

MAX_BACKOFF_S = 8.0
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class RemoteRewardConfig:
  url: str
  name: str = "remote"  # the reward's name in messages
  timeout_s: float = 30.0  # per attempt, in all: connect, send, read the whole answer
  max_retries: int = 3  # extra attempts after the first
  backoff_s: float = 0.5  # the wait before retry k is backoff_s * 2**k, at most MAX_BACKOFF_S
  max_concurrency: int = 4  # POSTs in flight at once
  batch_size: int = 64  # rows per POST
  headers: tuple = ()  # (name, value) pairs sent with every POST

  def check(self, where: str = "RemoteRewardConfig") -> "RemoteRewardConfig":
    """self, or a ConfigError naming the first bad field as `where.field`."""
    problems = config_problems(self)
    if problems:
      raise ConfigError(f"{where}.{problems[0]}")
    return self


class RemoteResult(NamedTuple):
  rewards: np.ndarray  # (B,) float32, 0.0 where failed
  failed: np.ndarray  # (B,) bool
  step_rewards: list | None  # per row a list of floats (None for a row without); None if no
  #                            chunk's answer had step_rewards
  errors: list  # one line per failed chunk or row, naming the URL and the reason
  outage: str | None = None  # the sentence of the first chunk whose retry budget ran out
  #                            (timeouts, connection errors, 5xx, 429), else None


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))


MAX_TIMEOUT_S = 1e6  # seconds: a longer deadline overflows the platform's timers


def headers_problem(headers) -> str | None:
  """Why `headers` is not a tuple of (str, str) pairs that http.client can send, without
  showing a value (a secret)."""
  if not isinstance(headers, (tuple, list)):
    return f"is a {type(headers).__name__}"
  for i, pair in enumerate(headers):
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(isinstance(part, str) for part in pair)):
      return f"has entry {i} that is not a (name, value) pair of strings"
    if any(c in part for part in pair for c in "\r\n") or not all(
        part.isascii() if j == 0 else max(map(ord, part), default=0) < 256
        for j, part in enumerate(pair)):
      return (f"has entry {i} with a line break, or a character HTTP headers cannot carry "
              f"(the name ASCII, the value Latin-1; a token read from a file keeps its newline)")
  return None


def config_problems(cfg: RemoteRewardConfig) -> list:
  """One sentence per bad field of cfg, each starting `field=value`; [] if none."""
  url = url_problem("url", cfg.url, "http://127.0.0.1:8000/score",
                    "pass the credentials in headers, e.g. (('Authorization', 'Basic ...'),)")
  problems = [url] if url else []
  if not (isinstance(cfg.name, str) and cfg.name):
    problems.append(f"name={cfg.name!r} must be a non-empty string; it names the reward in "
                    f"messages, e.g. 'remote'.")
  if not (_is_number(cfg.timeout_s) and 0 < cfg.timeout_s <= MAX_TIMEOUT_S):
    problems.append(f"timeout_s={cfg.timeout_s!r} must be a positive number of seconds, at most "
                    f"{MAX_TIMEOUT_S:g} (the timers' range); set it e.g. to 30.")
  for field, what in (("batch_size", "rows per request"), ("max_concurrency",
                                                           "requests in flight")):
    value = getattr(cfg, field)
    if not (_is_int(value) and value > 0):
      problems.append(f"{field}={value!r} must be a positive integer ({what}); set it to 1 or "
                      f"more.")
  if not (_is_int(cfg.max_retries) and cfg.max_retries >= 0):
    problems.append(f"max_retries={cfg.max_retries!r} must be an integer of 0 or more (extra "
                    f"attempts after the first); set it to e.g. 3.")
  if not (_is_number(cfg.backoff_s) and cfg.backoff_s >= 0):
    problems.append(f"backoff_s={cfg.backoff_s!r} must be a number of 0 or more seconds; set it "
                    f"to e.g. 0.5.")
  headers = headers_problem(cfg.headers)
  if headers:
    problems.append(f"headers {headers}; write them as a tuple of (name, value) string pairs, "
                    f"e.g. (('Authorization', 'Bearer TOKEN'),).")
  return problems


def backoff_delay(backoff_s: float, retry: int) -> float:
  """Seconds to wait before retry `retry` (0-based): backoff_s * 2**retry, at most
  MAX_BACKOFF_S."""
  return min(backoff_s * 2.0 ** min(retry, 60), MAX_BACKOFF_S)


def _source(cfg: RemoteRewardConfig) -> str:
  return f"remote reward {cfg.name!r} at {cfg.url}"


def _excerpt(value, limit: int) -> str:
  """The first `limit` characters of value (bytes decoded as UTF-8), quoted on one line."""
  if isinstance(value, bytes):
    value = value.decode("utf-8", errors="replace")
  text = value if isinstance(value, str) else json.dumps(value)
  return repr(text[:limit] + ("..." if len(text) > limit else ""))


class _Fault(Exception):
  """An attempt at a chunk failed. `transport`: the HTTP exchange itself failed (its message
  counts the attempts and the seconds they spanned); `retry`: another attempt may succeed (so
  a `retry` fault that is raised out of post_with_retries spent its retry budget: an outage)."""

  def __init__(self, reason: str, detail: str = "", transport: bool = False,
               retry: bool = False):
    super().__init__(reason)
    self.reason, self.detail, self.transport, self.retry = reason, detail, transport, retry
    self.attempts, self.seconds = 1, 0.0

  def describe(self) -> str:
    if not self.transport:
      return self.reason
    plural = "s" if self.attempts != 1 else ""
    span = f" in {self.seconds:.1f} s" if self.attempts > 1 else ""
    return f"{self.reason} ({self.attempts} attempt{plural}{span}){self.detail}"


def _status_fault(error: HttpStatus) -> _Fault:
  """The fault of a non-2xx answer: 5xx and 429 may pass, a redirect is not followed."""
  if 300 <= error.status < 400:
    where = _excerpt(public_url(error.location), 200) if error.location else "nowhere"
    return _Fault(f"answered HTTP {error.status} redirecting to {where}, which is not followed "
                  f"(it would carry the request's headers elsewhere); set the URL to the "
                  f"endpoint itself")
  return _Fault(f"answered HTTP {error.status}", f": {_excerpt(error.body, 200)}",
                transport=True, retry=error.status >= 500 or error.status == 429)


def _post(cfg: RemoteRewardConfig, body: bytes | None, abandon: Abandon | None) -> bytes:
  """One POST of body to cfg.url (a GET when body is None), ended within cfg.timeout_s: the
  answer's body, or a _Fault (Abandoned once `abandon` is set)."""
  headers = {"Accept": "application/json", **dict(cfg.headers)}
  if body is not None:
    headers = {"Content-Type": "application/json", **headers}
  try:
    return fetch("GET" if body is None else "POST", cfg.url, body, tuple(headers.items()),
                 cfg.timeout_s, abandon)
  except HttpStatus as e:
    raise _status_fault(e) from None
  except TimeoutError:  # DeadlineExceeded, or connecting took the whole socket timeout
    raise _Fault(f"timed out after {cfg.timeout_s:g} s", transport=True, retry=True) from None
  except (OSError, http.client.HTTPException, ValueError) as e:
    # (http.client's "Invalid header value b'...'" would print a header's value: a secret)
    why = "an invalid header" if str(e).startswith("Invalid header") else first_line(e, 200)
    raise _Fault("request failed", f": {why}", transport=True, retry=True) from None


def json_float(value) -> float | None:
  """A JSON number as a float (an int beyond float's range: inf of its sign); None if value is
  not a number."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  try:
    return float(value)
  except OverflowError:
    return math.inf if value > 0 else -math.inf


def _decode(data: bytes):
  try:
    return json.loads(data.decode("utf-8", errors="replace"))
  except json.JSONDecodeError as e:
    raise _Fault(f"returned malformed JSON ({e.msg}: line {e.lineno} column {e.colno}): "
                 f"{_excerpt(data, 100)}") from None
  except (ValueError, RecursionError) as e:
    raise _Fault(f"returned JSON that cannot be read ({first_line(e, 100)}): "
                 f"{_excerpt(data, 100)}") from None


def _rewards_field(payload, rows: int, first: int) -> list:
  """The rewards of an answer to `rows` rows from row `first`, as floats, or a _Fault."""
  rewards = payload.get("rewards") if isinstance(payload, dict) else payload
  if not isinstance(rewards, list):
    got = (f"an object with keys {sorted(payload)[:10]}" if isinstance(payload, dict)
           else f"a JSON {type(payload).__name__}")
    raise _Fault(f'returned {got} instead of {{"rewards": [...]}} or a list of numbers')
  if len(rewards) != rows:
    raise _Fault(f"returned {len(rewards)} rewards for {rows} rows")
  values = [json_float(r) for r in rewards]
  if None in values:
    i = values.index(None)
    raise _Fault(f"returned a non-numeric reward {_excerpt(rewards[i], 50)} for row {first + i}")
  return values


def _steps_field(payload, rows: int, first: int) -> list | None:
  """The step_rewards of an answer (per row a list of floats or None), None if it has none."""
  steps = payload.get("step_rewards") if isinstance(payload, dict) else None
  if steps is None:
    return None
  if not (isinstance(steps, list) and len(steps) == rows):
    raise _Fault(f"returned step_rewards that are not a list of {rows} lists (one per row)")
  out = []
  for i, row in enumerate(steps):
    values = [json_float(v) for v in row] if isinstance(row, list) else [None]
    if row is not None and None in values:
      raise _Fault(f"returned step_rewards for row {first + i} that are not a list of numbers: "
                   f"{_excerpt(row, 50)}")
    out.append(None if row is None else values)
  return out


def post_with_retries(cfg: RemoteRewardConfig, body: bytes | None, read,
                      abandon: Abandon | None = None):
  """read(the answer's JSON) of a POST of body to cfg.url (a GET when body is None), retried as
  the module docstring says (a transport fault, 5xx, 429); raises the last _Fault
  (.describe() says why), with the attempts made and the seconds they spanned. `read` raises
  _Fault for an answer that does not read. Once `abandon` is set (its caller left: an
  interrupt), raises Abandoned at once, mid-request or mid-wait."""
  attempts, start = 0, time.monotonic()
  while True:
    try:
      return read(_decode(_post(cfg, body, abandon)))
    except _Fault as fault:
      attempts += 1
      if not fault.retry or attempts > cfg.max_retries:
        fault.attempts, fault.seconds = attempts, time.monotonic() - start
        raise
    (abandon or Abandon()).wait(backoff_delay(cfg.backoff_s, attempts - 1))


def outage_fix(cfg: RemoteRewardConfig, names: tuple) -> str:
  """What to raise when the retry budget is spent: `names` are how the config spells
  (timeout_s, max_retries, backoff_s), shown with cfg's values."""
  values = (f"{cfg.timeout_s:g}", str(cfg.max_retries), f"{cfg.backoff_s:g}")
  return ", ".join(f"{n} (now {v})" for n, v in zip(names, values))


def _row_problem(reward: float, steps, row: int) -> str | None:
  """Why row `row` of a read answer fails (a value not finite in float32), None if it does not."""
  for what, value in [("reward", reward)] + [("step reward", s) for s in steps or ()]:
    if not math.isfinite(value):
      return f"returned a non-finite {what} {value!r} for row {row}"
    if abs(value) > FLOAT32_MAX:
      return f"returned a {what} {value!r} beyond float32's range for row {row}"
  return None


def _score_chunk(cfg: RemoteRewardConfig, body: bytes, rows: int, first: int,
                 abandon: Abandon) -> RemoteResult:
  """One chunk's rewards (its RemoteResult, as lists); a fault of the server fails its rows (or
  the row it touches)."""
  try:
    rewards, steps = post_with_retries(cfg, body, lambda payload: (
        _rewards_field(payload, rows, first), _steps_field(payload, rows, first)), abandon)
  except _Fault as fault:
    span = f"row {first}" if rows == 1 else f"rows {first}-{first + rows - 1}"
    outage = (f"{_source(cfg)}: {fault.describe()} on {span}; restart or fix the server, or "
              f"give it longer with its reward.remote entry's "
              f"{outage_fix(cfg, ('timeout_s', 'max_retries', 'backoff_s'))}."
              if fault.retry else None)  # a retry fault raised here spent its retry budget
    return RemoteResult([0.0] * rows, [True] * rows, None,
                  [f"{_source(cfg)}: {fault.describe()}; {span} scored 0"], outage)
  problems = [_row_problem(r, s, first + i)
              for i, (r, s) in enumerate(zip(rewards, steps or [None] * rows))]
  failed = [p is not None for p in problems]
  if steps is not None:
    steps = [None if bad else s for s, bad in zip(steps, failed)]
  return RemoteResult([0.0 if bad else r for r, bad in zip(rewards, failed)], failed, steps,
                [f"{_source(cfg)}: {p}" for p in problems if p is not None])


def _encode(queries, prompts, labels, first: int) -> bytes:
  try:
    return json.dumps({"queries": list(queries), "prompts": list(prompts),
                       "labels": list(labels)}).encode("utf-8")
  except (TypeError, ValueError) as e:
    raise TypeError(f"rows {first}-{first + len(queries) - 1} cannot be sent as JSON ({e}); pass "
                    f"str queries and prompts, and labels of JSON types (str, int, float, list, "
                    f"dict, None).") from None


def _join(chunks: list) -> RemoteResult:
  """The chunks' results as one, in row order."""
  steps = None
  if any(c.step_rewards is not None for c in chunks):
    steps = [s for c in chunks for s in (c.step_rewards or [None] * len(c.rewards))]
  return RemoteResult(np.asarray([r for c in chunks for r in c.rewards], np.float32),
                      np.asarray([f for c in chunks for f in c.failed], bool), steps,
                      [e for c in chunks for e in c.errors],
                      next((c.outage for c in chunks if c.outage), None))


def score_remote(cfg: RemoteRewardConfig, queries: list, prompts: list,
                 labels: list) -> RemoteResult:
  """The server's rewards for each row (module docstring); never raises for a server's fault
  (an interrupt in the waiting thread goes on at once, the requests in flight abandoned).

  Raises ConfigError for a bad cfg, ValueError if the three lists differ in length, and
  TypeError for rows that are not JSON, all before any request is sent."""
  cfg.check()
  if not len(queries) == len(prompts) == len(labels):
    raise ValueError(f"score_remote got {len(queries)} queries, {len(prompts)} prompts and "
                     f"{len(labels)} labels; pass one prompt and one label per query (repeat a "
                     f"prompt for each completion of its group).")
  size = cfg.batch_size
  starts = range(0, len(queries), size)
  bodies = [_encode(queries[s:s + size], prompts[s:s + size], labels[s:s + size], s)
            for s in starts]
  rows = [min(size, len(queries) - s) for s in starts]
  chunks = map_abandoning(lambda chunk, abandon: _score_chunk(cfg, *chunk, abandon),
                          list(zip(bodies, rows, starts)), min(cfg.max_concurrency, len(bodies)),
                          "remote-reward")
  return _join(chunks)


def raise_first(result: RemoteResult) -> None:
  """For train.on_reward_error='raise': raises RemoteRewardOutage (a RemoteOutage and a
  RewardError) if a chunk's retry budget ran out (the server is down or too slow), else a
  RewardError with the first error line if any row failed (the server answered something
  unusable)."""
  if result.outage:
    raise RemoteRewardOutage(result.outage)
  if np.any(result.failed):
    raise RewardError(result.errors[0] + "; fix the server or set train.on_reward_error='zero' "
                      "to score such completions 0 and count them.")


RemoteFault = _Fault  # what post_with_retries raises, and what its `read` raises
