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

Retries, per chunk: a timeout (no byte for cfg.timeout_s seconds while connecting or reading),
a connection error, HTTP 5xx and HTTP 429 are tried again, up to cfg.max_retries times after
the first attempt, waiting cfg.backoff_s * 2**k seconds (at most MAX_BACKOFF_S) before retry k
(0, 1, ...). Answers that would come out the same again are not retried: another HTTP status
(4xx), malformed JSON, no "rewards", a number of rewards other than the chunk's rows, or a value
that is not a number.

Faults of the server never raise: the rows they touch score 0, are marked failed, and get one
error line (naming the reward, the URL and the reason) per failed chunk or row. The caller picks
what a failure does: raise_first(result) stops the run (train.on_reward_error='raise'), or the
failed rows are counted (train.on_reward_error='zero'). Bad settings raise ConfigError before
any request is sent. Credentials go in cfg.headers (a user:password@ in the URL is refused), and
header values never appear in a message.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import numbers
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import NamedTuple

import numpy as np

from grpo_jax.errors import ConfigError, first_line
from grpo_jax.errors import RewardError

MAX_BACKOFF_S = 8.0
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class RemoteRewardConfig:
  url: str
  name: str = "remote"  # the reward's name in messages
  timeout_s: float = 30.0  # per connect / read, as urllib applies it
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


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))


def _url_parts(url):
  """urlsplit(url) if url is an http:// or https:// URL with a host, else None."""
  try:
    parts = urllib.parse.urlsplit(url)
    return parts if parts.scheme in ("http", "https") and parts.hostname else None
  except (TypeError, ValueError, AttributeError):
    return None


def _headers_problem(headers) -> str | None:
  """Why `headers` is not a tuple of (str, str) pairs, without showing a value (a secret)."""
  if not isinstance(headers, (tuple, list)):
    return f"is a {type(headers).__name__}"
  for i, pair in enumerate(headers):
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(isinstance(part, str) for part in pair)):
      return f"has entry {i} that is not a (name, value) pair of strings"
  return None


def config_problems(cfg: RemoteRewardConfig) -> list:
  """One sentence per bad field of cfg, each starting `field=value`; [] if none."""
  problems, parts = [], _url_parts(cfg.url)
  if parts is None:
    problems.append(f"url={cfg.url!r} is not an http:// or https:// URL; set it to the reward "
                    f"server's endpoint, e.g. 'http://127.0.0.1:8000/score'.")
  elif "@" in parts.netloc:  # urllib would not send it; shown without it (a secret)
    public = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    problems.append(f"url={public!r} has a user:password@ part, which is not sent; remove it "
                    f"and pass the credentials in headers, e.g. (('Authorization', 'Basic "
                    f"...'),).")
  if not (isinstance(cfg.name, str) and cfg.name):
    problems.append(f"name={cfg.name!r} must be a non-empty string; it names the reward in "
                    f"messages, e.g. 'remote'.")
  if not (_is_number(cfg.timeout_s) and cfg.timeout_s > 0):
    problems.append(f"timeout_s={cfg.timeout_s!r} must be a positive number of seconds; set it "
                    f"above 0, e.g. 30.")
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
  headers = _headers_problem(cfg.headers)
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
  counts the attempts); `retry`: another attempt may succeed."""

  def __init__(self, reason: str, detail: str = "", transport: bool = False,
               retry: bool = False):
    super().__init__(reason)
    self.reason, self.detail, self.transport, self.retry = reason, detail, transport, retry
    self.attempts = 1

  def describe(self) -> str:
    if not self.transport:
      return self.reason
    plural = "s" if self.attempts != 1 else ""
    return f"{self.reason} ({self.attempts} attempt{plural}){self.detail}"


def _http_fault(error: urllib.error.HTTPError) -> _Fault:
  try:
    body = error.read()
  except Exception:  # noqa: BLE001  the body is only for the message
    body = b""
  return _Fault(f"answered HTTP {error.code}", f": {_excerpt(body, 200)}", transport=True,
                retry=error.code >= 500 or error.code == 429)


def _post(cfg: RemoteRewardConfig, body: bytes) -> bytes:
  """One POST of body to cfg.url: the answer's body, or a _Fault."""
  headers = {"Content-Type": "application/json", "Accept": "application/json",
             **dict(cfg.headers)}
  request = urllib.request.Request(cfg.url, data=body, headers=headers, method="POST")
  try:
    with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
      return response.read()
  except urllib.error.HTTPError as e:
    raise _http_fault(e) from None
  except Exception as e:  # noqa: BLE001  socket, http.client and urllib errors alike
    cause = e.reason if isinstance(getattr(e, "reason", None), BaseException) else e
    if isinstance(cause, TimeoutError):
      raise _Fault(f"timed out after {cfg.timeout_s:g} s", transport=True, retry=True) from None
    raise _Fault("request failed", f": {first_line(cause, 200)}", transport=True,
                 retry=True) from None


def _as_float(value) -> float | None:
  """A JSON number as a float (inf beyond float's range); None if value is not a number."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  try:
    return float(value)
  except OverflowError:
    return math.inf


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
  values = [_as_float(r) for r in rewards]
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
    values = [_as_float(v) for v in row] if isinstance(row, list) else [None]
    if row is not None and None in values:
      raise _Fault(f"returned step_rewards for row {first + i} that are not a list of numbers: "
                   f"{_excerpt(row, 50)}")
    out.append(None if row is None else values)
  return out


def _request(cfg: RemoteRewardConfig, body: bytes, rows: int, first: int):
  """(rewards, step_rewards or None) of one chunk, posting until an answer reads or the
  attempts run out; raises the last _Fault, with the attempts made."""
  return post_with_retries(cfg, body, lambda payload: (_rewards_field(payload, rows, first),
                                                       _steps_field(payload, rows, first)))


def post_with_retries(cfg: RemoteRewardConfig, body: bytes, read):
  """read(the answer's JSON) of a POST of body to cfg.url, retried as the module docstring says
  (a transport fault, 5xx, 429); raises the last _Fault (.describe() says why), with the
  attempts made. `read` raises _Fault for an answer that does not read."""
  attempts = 0
  while True:
    try:
      return read(_decode(_post(cfg, body)))
    except _Fault as fault:
      attempts += 1
      if not fault.retry or attempts > cfg.max_retries:
        fault.attempts = attempts
        raise
    time.sleep(backoff_delay(cfg.backoff_s, attempts - 1))


def _row_problem(reward: float, steps, row: int) -> str | None:
  """Why row `row` of a read answer fails (a value not finite in float32), None if it does not."""
  for what, value in [("reward", reward)] + [("step reward", s) for s in steps or ()]:
    if not math.isfinite(value):
      return f"returned a non-finite {what} {value!r} for row {row}"
    if abs(value) > FLOAT32_MAX:
      return f"returned a {what} {value!r} beyond float32's range for row {row}"
  return None


class _Chunk(NamedTuple):
  rewards: list
  failed: list
  step_rewards: list | None
  errors: list


def _score_chunk(cfg: RemoteRewardConfig, body: bytes, rows: int, first: int) -> _Chunk:
  """One chunk's rewards; a fault of the server fails its rows (or the row it touches)."""
  try:
    rewards, steps = _request(cfg, body, rows, first)
  except _Fault as fault:
    span = f"row {first}" if rows == 1 else f"rows {first}-{first + rows - 1}"
    return _Chunk([0.0] * rows, [True] * rows, None,
                  [f"{_source(cfg)}: {fault.describe()}; {span} scored 0"])
  problems = [_row_problem(r, s, first + i)
              for i, (r, s) in enumerate(zip(rewards, steps or [None] * rows))]
  failed = [p is not None for p in problems]
  if steps is not None:
    steps = [None if bad else s for s, bad in zip(steps, failed)]
  return _Chunk([0.0 if bad else r for r, bad in zip(rewards, failed)], failed, steps,
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
                      [e for c in chunks for e in c.errors])


def score_remote(cfg: RemoteRewardConfig, queries: list, prompts: list,
                 labels: list) -> RemoteResult:
  """The server's rewards for each row (module docstring); never raises for a server's fault.

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
  workers = max(1, min(cfg.max_concurrency, len(bodies)))
  with concurrent.futures.ThreadPoolExecutor(workers, "remote-reward") as pool:
    chunks = list(pool.map(lambda b, n, s: _score_chunk(cfg, b, n, s), bodies, rows, starts))
  return _join(chunks)


def raise_first(result: RemoteResult) -> None:
  """Raises a RewardError with the first error line if any row failed (for
  train.on_reward_error='raise')."""
  if np.any(result.failed):
    raise RewardError(result.errors[0] + "; fix the server or set train.on_reward_error='zero' "
                      "to score such completions 0 and count them.")


RemoteFault = _Fault  # what post_with_retries raises, and what its `read` raises
