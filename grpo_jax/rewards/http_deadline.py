"""One HTTP request with a total deadline, with the standard library (http.client): what the
remote reward servers (grpo_jax/rewards/remote.py) and the distillation teacher
(grpo_jax/rewards/remote_teacher.py) are called with.

    fetch(method, url, body, headers, timeout_s) -> the body of a 2xx answer

`timeout_s` bounds the whole exchange: connecting, sending the request, and reading the status
line, the headers and the whole body. A server that answers one byte at a time ends at the
deadline like one that never answers (DeadlineExceeded), because a timer shuts the socket down
when the time is up; a socket timeout alone bounds one read, not the request. Connecting (and
a TLS handshake) is bounded by the socket timeout (timeout_s) only, since the timer watches the
socket once it is connected; the host name lookup before it is the system resolver's.

Redirects are not followed: a 3xx answer raises HttpStatus with its Location, like any other
status outside 2xx, so the request's headers (an Authorization, a Cookie) never reach another
origin. http_proxy / https_proxy / no_proxy are honoured as urllib honours them.

    map_abandoning(call, items, workers) -> [call(item, abandon) for item in items]

runs a batch of requests in threads. When waiting for them raises (one of them failed for good,
or a signal reached the waiting thread: grpo_jax/interrupts.py), the exception goes on at once:
the Abandon that every call was given cuts the requests in flight (their sockets shut down),
ends their backoff waits and starts no new attempt, so neither the caller nor the process's exit
waits for a server (a request still connecting ends at its socket timeout).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse
import urllib.request

from grpo_jax.interrupts import stop_if_signalled

BODY_EXCERPT = 1024  # bytes of a non-2xx answer's body kept for its message


class DeadlineExceeded(TimeoutError):
  """The whole exchange did not end within timeout_s seconds."""


class Abandoned(Exception):
  """The caller stopped waiting for this request (Abandon.set)."""


class HttpStatus(Exception):
  """An answer with a status outside 2xx (3xx included: redirects are not followed)."""

  def __init__(self, status: int, body: bytes, location: str | None):
    super().__init__(f"HTTP {status}")
    self.status, self.body, self.location = status, body, location


def public_url(url: str) -> str:
  """url without a user:password@ part (for messages: it may hold a secret)."""
  try:
    parts = urllib.parse.urlsplit(url)
  except ValueError:
    return "<an unreadable URL>"
  return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _url_parts(url):
  """urlsplit(url) if url is an http:// or https:// URL with a host (and a port, if any, in
  0-65535), else None."""
  try:
    parts = urllib.parse.urlsplit(url)
    parts.port  # noqa: B018  raises ValueError on a port out of range or not a number
    return parts if parts.scheme in ("http", "https") and parts.hostname else None
  except (TypeError, ValueError, AttributeError):
    return None


def url_problem(field: str, url, example: str, credentials_fix: str) -> str | None:
  """Why `url` cannot be called, as one sentence starting `field=url` (a user:password@ part
  left out of it: it is a secret), or None. `example` is a URL that would do;
  `credentials_fix` says where the credentials go instead (after "remove it and ...")."""
  parts = _url_parts(url)
  if parts is None:
    return (f"{field}={url!r} is not an http:// or https:// URL; set it to the server's "
            f"endpoint, e.g. {example!r}.")
  if "@" in parts.netloc:
    return (f"{field}={public_url(url)!r} has a user:password@ part, which is not sent; remove "
            f"it and {credentials_fix}.")
  return None


class _Deadline:
  """Shuts the watched socket down once `timeout_s` has passed (or at expire()), which ends a
  read or a write in progress at once; `expired` is the error that ended it, else None. A
  context manager: leaving it cancels the timer and closes the connection."""

  def __init__(self, connection: http.client.HTTPConnection, timeout_s: float):
    self.connection, self.sock, self.expired = connection, None, None
    self.timer = threading.Timer(timeout_s, self.expire)
    self.timer.daemon = True

  def expire(self, error: type = DeadlineExceeded) -> None:
    """Ends the exchange now: check() raises `error` from here on."""
    self.expired = self.expired or error  # set before reading .sock: see watch()
    if self.sock is not None:
      try:
        self.sock.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  def watch(self, sock) -> None:
    """Watches the connected socket (kept here: http.client lets go of its own reference once
    an answer that closes the connection has started), or raises DeadlineExceeded if the time
    is already up. This sets .sock and then reads .expired, the timer sets .expired and then
    reads .sock, so one of the two sees the other's write: no socket outlives the deadline."""
    self.sock = sock
    self.check()

  def check(self) -> None:
    """Raises DeadlineExceeded if the time is up (Abandoned if the caller left)."""
    if self.expired:
      raise self.expired

  def __enter__(self) -> "_Deadline":
    self.timer.start()
    return self

  def __exit__(self, *exc) -> None:
    self.timer.cancel()
    self.connection.close()


def _proxy_for(parts: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
  """The proxy the environment names for this URL (urllib's rules), or None."""
  proxy = urllib.request.getproxies().get(parts.scheme)
  if not proxy or urllib.request.proxy_bypass(parts.hostname):
    return None
  return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _proxy_headers(proxy: urllib.parse.SplitResult) -> dict:
  """A Proxy-Authorization for a proxy URL with user:password@, else {}."""
  if proxy.username is None:
    return {}
  pair = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
  return {"Proxy-Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def _connection(url: str, timeout_s: float):
  """(an unopened connection, the request target, headers for a proxy) for url."""
  parts = urllib.parse.urlsplit(url)
  target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
  https = parts.scheme == "https"
  extra = {"context": ssl.create_default_context()} if https else {}
  kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
  proxy = _proxy_for(parts)
  port = parts.port or (443 if https else 80)  # given: an IPv6 host holds colons
  if proxy is None:
    return kind(parts.hostname, port, timeout=timeout_s, **extra), target, {}
  headers = _proxy_headers(proxy)
  connection = kind(proxy.hostname, proxy.port or (443 if proxy.scheme == "https" else 80),
                    timeout=timeout_s, **extra)
  if https:  # a CONNECT tunnel through the proxy, TLS to the server inside it
    connection.set_tunnel(parts.hostname, port, headers=headers)
    return connection, target, {}
  return connection, public_url(url), headers  # a plain-HTTP proxy takes the whole URL


class Abandon:
  """Set when the caller of a batch of requests stops waiting for them: the requests in flight
  end at once (Abandoned), a backoff wait (`wait`) ends, and no new request starts."""

  def __init__(self):
    self.event, self.lock, self.live = threading.Event(), threading.Lock(), set()

  def set(self) -> None:
    with self.lock:
      self.event.set()
      live = list(self.live)
    for deadline in live:
      deadline.expire(Abandoned)

  def wait(self, seconds: float) -> None:
    """Sleeps `seconds`, or raises Abandoned as soon as the caller leaves."""
    if self.event.wait(seconds):
      raise Abandoned

  @contextlib.contextmanager
  def watching(self, deadline: _Deadline):
    with self.lock:
      if self.event.is_set():
        raise Abandoned
      self.live.add(deadline)
    try:
      yield
    finally:
      with self.lock:
        self.live.discard(deadline)


def fetch(method: str, url: str, body: bytes | None = None, headers=(),
          timeout_s: float = 30.0, abandon: Abandon | None = None) -> bytes:
  """The body of a 2xx answer to one `method` request of `body` to `url` (an http:// or
  https:// URL) with `headers` ((name, value) pairs); the whole exchange ends within
  `timeout_s` seconds, or as soon as `abandon` is set.

  Raises DeadlineExceeded when the time is up, Abandoned, HttpStatus for another status (3xx
  included), and OSError or http.client.HTTPException when the connection fails."""
  connection, target, proxy_headers = _connection(url, timeout_s)
  with _Deadline(connection, timeout_s) as deadline, \
      (abandon or Abandon()).watching(deadline):
    try:
      connection.connect()
      deadline.watch(connection.sock)
      connection.request(method, target, body=body,
                         headers={**dict(headers), **proxy_headers})
      response = connection.getresponse()
      data = response.read()
    except (OSError, http.client.HTTPException, ValueError):
      deadline.check()  # a read cut short by the deadline is the deadline's fault
      raise
    deadline.check()
  if not 200 <= response.status < 300:
    raise HttpStatus(response.status, data[:BODY_EXCERPT], response.getheader("Location"))
  return data


def map_abandoning(call, items, workers: int, name: str) -> list:
  """[call(item, abandon) for item in items], at most `workers` at once in threads. If waiting
  for them raises (the exception of the call that fails first in time, whatever its item, or a
  signal's in this thread: any BaseException), the calls still running are abandoned (module
  docstring) and the exception goes on at once."""
  stop_if_signalled()  # a signal already in: no request is started
  abandon = Abandon()
  pool = concurrent.futures.ThreadPoolExecutor(max(1, workers), name)
  try:
    futures = [pool.submit(call, item, abandon) for item in items]
    for future in concurrent.futures.as_completed(futures):
      future.result()  # the first to fail raises here, not after the items before it
    return [future.result() for future in futures]
  except BaseException:
    abandon.set()
    raise
  finally:
    pool.shutdown(wait=not abandon.event.is_set(), cancel_futures=True)
