"""A distillation teacher behind HTTP: rl.distill_teacher = "http://HOST:PORT" (grpo_jax/rl/
distill.py), served by `python -m grpo_jax.serve_teacher --model DIR` or any server that speaks
this protocol (token ids in, per-token log-probs out; the teacher shares the policy's tokenizer):

    GET  URL/info      -> {"vocab_size": int, "vocab_sha256": str or null}
    POST URL/logprobs  {"prompt_ids": [[int, ...], ...], "completion_ids": [[int, ...], ...]}
                       -> {"logprobs": [[float, ...], ...]}   one per completion token, in order

vocab_sha256 is vocab_digest of the teacher's tokenizer (null when it has none to compare): at
the start a digest or vocab_size other than the policy's is one ConfigError sentence. With
rl.distill_teacher_token_env every request carries `Authorization: Bearer <that variable>`.

Rows go in chunks of RemoteRewardConfig's batch_size, max_concurrency chunks in flight. Each
attempt must end within rl.distill_teacher_timeout_s (connect, send, read the whole answer;
grpo_jax/rewards/http_deadline.py); timeouts, connection errors, 5xx and 429 are retried up to
rl.distill_teacher_max_retries times, waiting rl.distill_teacher_backoff_s * 2**k before retry
k (grpo_jax/rewards/remote.py). A teacher whose retry budget runs out stops the run with a
RemoteOutage sentence (the run saves its last completed step); an answer that cannot be right
(another status, a redirect, the wrong number of rows or tokens, a log-prob that is not a
number or is above 0) with a RewardError sentence, both naming the URL: a distillation step
without its teacher has no signal to stand on. A NaN or -Infinity log-prob is a number: it
fails its row (grpo_jax/rewards/estimator_inputs.py, train.on_reward_error).
docs/remote_services.md is the user's page.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from grpo_jax.errors import ConfigError, RemoteOutage, RewardError
from grpo_jax.rewards.http_deadline import map_abandoning, url_problem
from grpo_jax.rewards.remote import (RemoteFault, RemoteRewardConfig, config_problems,
                                     headers_problem, json_float, outage_fix,
                                     post_with_retries)
from grpo_jax.rewards.sources import row_prompts

# A log-prob may exceed 0 by this much (the rounding of log_softmax for a token of probability
# ~1 with large logits, e.g. fp32 logits near 1000); past it the answer is refused.
LOGPROB_ROUNDING = 1e-3
# How the config spells the client's (timeout_s, max_retries, backoff_s), for messages.
SETTINGS = ("rl.distill_teacher_timeout_s", "rl.distill_teacher_max_retries",
            "rl.distill_teacher_backoff_s")
ANSWER = ('it must answer {"logprobs": [[...], ...]} with one log-prob <= 0 per completion '
          'token, as python -m grpo_jax.serve_teacher does')


def is_url(value: str) -> bool:
  return value.startswith(("http://", "https://"))


def vocab_digest(tokenizer) -> str | None:
  """sha256 of a tokenizer's vocabulary ({token: id}, sorted), or None without get_vocab."""
  vocab = getattr(tokenizer, "get_vocab", None)
  if vocab is None:
    return None
  return hashlib.sha256(json.dumps(sorted(vocab().items())).encode()).hexdigest()


def settings_problem(url, timeout_s, max_retries, backoff_s) -> str | None:
  """Why rl.distill_teacher (a URL) and its client's settings cannot work, as one sentence
  naming the field (a user:password@ part left out: it is a secret), or None. The checks are
  reward.remote's (grpo_jax/rewards/remote.py)."""
  problem = url_problem("rl.distill_teacher", url, "http://127.0.0.1:8000",
                        "give a token with rl.distill_teacher_token_env (the name of an "
                        "environment variable holding it) if the teacher's server needs one")
  if problem:
    return problem
  cfg = RemoteRewardConfig(url=url, timeout_s=timeout_s, max_retries=max_retries,
                           backoff_s=backoff_s)
  return next((f"rl.distill_teacher_{p}" for p in config_problems(cfg)), None)


def _ids(tokens, mask) -> list:
  """Each row's token ids as a list, padding dropped."""
  return [t[m].tolist() for t, m in zip(np.asarray(tokens), np.asarray(mask).astype(bool))]


def _logprob(value, row: int, token: int) -> float:
  """A JSON number the answer gave as a log-prob, as a float; RemoteFault if it is not a
  number or lies above 0 (NaN passes: the row check after this fails its row)."""
  number = json_float(value)
  if number is None:
    shown = json.dumps(value)[:40]
    raise RemoteFault(f"answered a log-prob that is not a number, {shown}, for row {row} token "
                      f"{token}")
  if number > LOGPROB_ROUNDING:
    raise RemoteFault(f"answered the log-prob {number!r} for row {row} token {token}, above 0 "
                      f"(a log-probability is at most 0: logits or probabilities were sent)")
  return number


def read_logprobs(payload, completion_ids: list, first: int) -> list:
  """The answer's log-probs, one list of floats per row (row `first` first); RemoteFault for an
  answer without one number <= 0 per completion token of each row."""
  values = payload.get("logprobs") if isinstance(payload, dict) else None
  if not isinstance(values, list) or len(values) != len(completion_ids):
    got = len(values) if isinstance(values, list) else "no list of"
    raise RemoteFault(f"answered without one log-prob per completion token of each row ({got} "
                      f"rows of log-probs for {len(completion_ids)} rows)")
  out = []
  for i, (row, ids) in enumerate(zip(values, completion_ids)):
    if not isinstance(row, list) or len(row) != len(ids):
      got = len(row) if isinstance(row, list) else "no list of"
      raise RemoteFault(f"answered without one log-prob per completion token of each row ({got} "
                        f"log-probs for row {first + i}'s {len(ids)} tokens)")
    out.append([_logprob(v, first + i, t) for t, v in enumerate(row)])
  return out


def token_headers(token_env: str) -> tuple:
  """The Authorization header of the token in $token_env (() for ""), or a ConfigError that
  names the variable, never the token (a line break inside it: http.client would refuse it
  and print it)."""
  if not token_env:
    return ()
  token = os.environ.get(token_env, "").strip()  # (a pasted trailing newline)
  headers = (("Authorization", f"Bearer {token}"),)
  if headers_problem(headers) is not None:
    raise ConfigError(f"rl.distill_teacher_token_env={token_env!r}: the token in ${token_env} "
                      f"has a line break or a character HTTP headers cannot carry (Latin-1); "
                      f"export it again as one line.")
  return headers


@dataclasses.dataclass(frozen=True)
class RemoteTeacher:
  """TeacherSource's interface (grpo_jax/rewards/sources.py) over HTTP."""
  cfg: RemoteRewardConfig  # url = the server's /logprobs

  @classmethod
  def connect(cls, url: str, tokenizer, vocab_size: int | None = None, token_env: str = "",
              timeout_s: float = 60.0, max_retries: int = 5,
              backoff_s: float = 1.0) -> "RemoteTeacher":
    """The teacher at `url`, its /info checked (one attempt) against the policy's tokenizer
    (and against the policy's vocab_size, when given: a model built from the config).
    `token_env` names the environment variable of its token ("" = none); timeout_s,
    max_retries and backoff_s are the rl.distill_teacher_* settings."""
    problem = settings_problem(url, timeout_s, max_retries, backoff_s)
    if problem:
      raise ConfigError(problem)
    base = url.rstrip("/")
    headers = token_headers(token_env)
    cfg = RemoteRewardConfig(url=f"{base}/info", name="distillation teacher",
                             timeout_s=timeout_s, max_retries=0, backoff_s=backoff_s,
                             headers=headers)
    try:
      info = post_with_retries(cfg, None, lambda payload: payload)
    except RemoteFault as fault:
      fix = ("give its token with rl.distill_teacher_token_env (the name of an environment "
             "variable holding it)" if "HTTP 401" in fault.reason or "HTTP 403" in fault.reason
             else "start the teacher's server (python -m grpo_jax.serve_teacher --model DIR) "
                  "or fix the URL")
      raise ConfigError(f"rl.distill_teacher={url!r}: GET {base}/info failed ({fault.reason}"
                        f"{fault.detail}); {fix}.") from None
    ours = vocab_digest(tokenizer)
    theirs = info.get("vocab_sha256") if isinstance(info, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("vocab_size"), int):
      raise ConfigError(f"rl.distill_teacher={url!r}: {base}/info answered {info!r:.200}, not "
                        f"{{\"vocab_size\": int, \"vocab_sha256\": str or null}}.")
    if ((ours and theirs and ours != theirs) or info["vocab_size"] < len(tokenizer) or
        (vocab_size is not None and info["vocab_size"] != vocab_size)):
      raise ConfigError(f"rl.distill_teacher={url!r} has another tokenizer than the policy's "
                        f"(vocab_size {info['vocab_size']}, policy tokenizer {len(tokenizer)} "
                        f"tokens{', vocabularies differ' if ours and theirs else ''}); "
                        f"on-policy distillation compares log-probs token by token.")
    return cls(dataclasses.replace(cfg, url=f"{base}/logprobs", max_retries=max_retries))

  def logprobs(self, prompts, tokens, mask, group_size: int) -> np.ndarray:
    """(B, N) the teacher's log-probs of each row's completion tokens, 0 outside them."""
    tokens, mask = np.asarray(tokens), np.asarray(mask).astype(bool)
    prompt_ids, completion_ids = _ids(*row_prompts(prompts, group_size)), _ids(tokens, mask)
    size = self.cfg.batch_size
    starts = range(0, len(prompt_ids), size)  # the first chunk to fail for good abandons the rest
    chunks = map_abandoning(lambda s, abandon: self._chunk(prompt_ids[s:s + size],
                                                           completion_ids[s:s + size], s, abandon),
                            starts, self.cfg.max_concurrency, "teacher")
    out = np.zeros(tokens.shape, np.float32)
    for row, values in enumerate(v for chunk in chunks for v in chunk):
      out[row, np.flatnonzero(mask[row])] = values
    return out

  def _chunk(self, prompt_ids, completion_ids, first: int, abandon) -> list:
    """One chunk's log-probs; RemoteOutage once its retry budget is spent, RewardError for an
    answer that cannot be right (module docstring)."""
    body = json.dumps({"prompt_ids": prompt_ids, "completion_ids": completion_ids}).encode()
    try:
      return post_with_retries(self.cfg, body,
                               lambda payload: read_logprobs(payload, completion_ids, first),
                               abandon)
    except RemoteFault as fault:
      asked = f"the distillation teacher at {self.cfg.url}, asked for rows {first}-" \
              f"{first + len(prompt_ids) - 1}, {fault.describe()}"
      if fault.retry:
        raise RemoteOutage(f"{asked}; restart it, or give it longer with "
                           f"{outage_fix(self.cfg, SETTINGS)}.") from None
      raise RewardError(f"{asked}; fix its server: {ANSWER}.") from None
