"""A distillation teacher behind HTTP: rl.distill_teacher = "http://HOST:PORT" (grpo_jax/rl/
distill.py), served by `python -m grpo_jax.serve_teacher --model DIR` or any server that speaks
this protocol (token ids in, per-token log-probs out; the teacher shares the policy's tokenizer):

    GET  URL/info      -> {"vocab_size": int, "vocab_sha256": str or null}
    POST URL/logprobs  {"prompt_ids": [[int, ...], ...], "completion_ids": [[int, ...], ...]}
                       -> {"logprobs": [[float, ...], ...]}   one per completion token, in order

vocab_sha256 is vocab_digest of the teacher's tokenizer (null when it has none to compare): at
the start a digest or vocab_size other than the policy's is one ConfigError sentence. Rows go
in chunks of RemoteRewardConfig's batch_size, max_concurrency chunks in flight, each retried as
a remote reward is (grpo_jax/rewards/remote.py: timeouts, connection errors, 5xx, 429). A
teacher that still fails, or answers the wrong number of rows or tokens, stops the run with
one RewardError sentence naming the URL and the reason: a distillation step without its
teacher has no signal to stand on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import urllib.error
import urllib.request

import numpy as np

from grpo_jax.errors import ConfigError, RewardError, first_line
from grpo_jax.rewards.remote import RemoteFault, RemoteRewardConfig, post_with_retries


def is_url(value: str) -> bool:
  return value.startswith(("http://", "https://"))


def vocab_digest(tokenizer) -> str | None:
  """sha256 of a tokenizer's vocabulary ({token: id}, sorted), or None without get_vocab."""
  vocab = getattr(tokenizer, "get_vocab", None)
  if vocab is None:
    return None
  return hashlib.sha256(json.dumps(sorted(vocab().items())).encode()).hexdigest()


def _rows(prompt_tokens, prompt_mask, tokens, mask) -> tuple[list, list]:
  """The rows' prompt ids and completion ids as lists, padding dropped."""
  prompts = [t[m.astype(bool)].tolist() for t, m in zip(np.asarray(prompt_tokens),
                                                        np.asarray(prompt_mask))]
  completions = [t[m.astype(bool)].tolist() for t, m in zip(np.asarray(tokens), np.asarray(mask))]
  return prompts, completions


@dataclasses.dataclass(frozen=True)
class RemoteTeacher:
  """TeacherSource's interface (grpo_jax/rewards/sources.py) over HTTP."""
  cfg: RemoteRewardConfig  # url = the server's base URL

  @classmethod
  def connect(cls, url: str, tokenizer, vocab_size: int | None = None) -> "RemoteTeacher":
    """The teacher at `url`, its /info checked against the policy's tokenizer (and against
    the policy's vocab_size, when given: a model built from the config)."""
    base = url.rstrip("/")
    try:
      with urllib.request.urlopen(f"{base}/info", timeout=30) as response:
        info = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
      raise ConfigError(f"rl.distill_teacher={url!r}: GET {base}/info failed ({first_line(e)}); "
                        f"start the teacher's server (python -m grpo_jax.serve_teacher --model "
                        f"DIR) or fix the URL.") from None
    ours = vocab_digest(tokenizer)
    theirs = info.get("vocab_sha256") if isinstance(info, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("vocab_size"), int):
      raise ConfigError(f"rl.distill_teacher={url!r}: {base}/info answered {info!r}, not "
                        f"{{\"vocab_size\": int, \"vocab_sha256\": str or null}}.")
    if ((ours and theirs and ours != theirs) or info["vocab_size"] < len(tokenizer) or
        (vocab_size is not None and info["vocab_size"] != vocab_size)):
      raise ConfigError(f"rl.distill_teacher={url!r} has another tokenizer than the policy's "
                        f"(vocab_size {info['vocab_size']}, policy tokenizer {len(tokenizer)} "
                        f"tokens{', vocabularies differ' if ours and theirs else ''}); "
                        f"on-policy distillation compares log-probs token by token.")
    return cls(RemoteRewardConfig(url=f"{base}/logprobs", name="distillation teacher"))

  def logprobs(self, prompts, tokens, mask, group_size: int) -> np.ndarray:
    """(B, N) the teacher's log-probs of each row's completion tokens, 0 outside them."""
    tokens, mask = np.asarray(tokens), np.asarray(mask).astype(bool)
    prompt_ids, completion_ids = _rows(np.repeat(np.asarray(prompts.prompt_tokens), group_size, 0),
                                       np.repeat(np.asarray(prompts.prompt_mask), group_size, 0),
                                       tokens, mask)
    size = self.cfg.batch_size
    starts = range(0, len(prompt_ids), size)
    with concurrent.futures.ThreadPoolExecutor(self.cfg.max_concurrency) as pool:
      chunks = list(pool.map(lambda s: self._chunk(prompt_ids[s:s + size],
                                                   completion_ids[s:s + size], s), starts))
    out = np.zeros(tokens.shape, np.float32)
    for row, values in enumerate(v for chunk in chunks for v in chunk):
      out[row, np.flatnonzero(mask[row])] = values
    return out

  def _chunk(self, prompt_ids, completion_ids, first: int) -> list:
    def read(payload):
      values = payload.get("logprobs") if isinstance(payload, dict) else None
      if (not isinstance(values, list) or len(values) != len(completion_ids) or
          any(not isinstance(v, list) or len(v) != len(c) for v, c in zip(values, completion_ids))):
        raise RemoteFault("answered without one log-prob per completion token of each row")
      return values
    body = json.dumps({"prompt_ids": prompt_ids, "completion_ids": completion_ids}).encode()
    try:
      return post_with_retries(self.cfg, body, read)
    except RemoteFault as fault:
      raise RewardError(f"the distillation teacher at {self.cfg.url} failed on rows {first}-"
                        f"{first + len(prompt_ids) - 1}: {fault.describe()}; check its server.")
