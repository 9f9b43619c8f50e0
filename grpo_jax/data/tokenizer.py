"""A character-level tokenizer for the built-in synthetic tasks (no files, no downloads)."""

from __future__ import annotations

import numpy as np


class CharTokenizer:
  """ids 0..2 are <pad>, <bos>, <eos>; then one id per character of `alphabet`."""

  pad_id, bos_id, eos_id = 0, 1, 2
  _specials = ("<pad>", "<bos>", "<eos>")

  def __init__(self, alphabet: str):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError(f"alphabet {alphabet!r} repeats a character.")
    self.alphabet = alphabet
    self._ids = {c: i + len(self._specials) for i, c in enumerate(alphabet)}

  @property
  def vocab_size(self) -> int:
    return len(self._specials) + len(self.alphabet)

  def __len__(self) -> int:
    return self.vocab_size

  def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
    try:
      ids = [self._ids[c] for c in text]
    except KeyError as e:
      raise ValueError(f"character {e.args[0]!r} of {text!r} is not in the tokenizer's "
                       f"alphabet {self.alphabet!r}.") from None
    return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

  def decode(self, ids, stop_at_eos: bool = True) -> str:
    out = []
    for i in np.asarray(ids).tolist():
      if i == self.eos_id and stop_at_eos:
        break
      if len(self._specials) <= i < self.vocab_size:  # (a model's ids past it: no text)
        out.append(self.alphabet[i - len(self._specials)])
    return "".join(out)


class CharTask:
  """A mixin of the tasks on a CharTokenizer (`self.tokenizer`): their eos / pad ids, the text
  of completion rows, and their scores by a "tokens" reward (`self.reward`) against the
  batch's target_tokens / target_mask."""

  @property
  def eos_id(self) -> int:
    return self.tokenizer.eos_id

  @property
  def pad_id(self) -> int:
    return self.tokenizer.pad_id

  def decode(self, completion_tokens, completion_mask) -> list[str]:
    return [self.tokenizer.decode(t[m].tolist()) for t, m in
            zip(np.asarray(completion_tokens), np.asarray(completion_mask, bool))]

  def _targets(self, batch, group_size: int, xp=np):
    repeat = lambda x: xp.repeat(x, group_size, axis=0)  # noqa: E731
    return repeat(batch.target_tokens), repeat(batch.target_mask)

  def score(self, batch, completion_tokens, completion_mask, group_size: int):
    """Rewards (B * G,) of the G completions of each prompt (rows grouped contiguously)."""
    return np.asarray(self.reward.fn(completion_tokens, completion_mask,
                                     *self._targets(batch, group_size)))

  def eval_scores(self, batch, completion_tokens, completion_mask) -> dict:
    return {"eval_accuracy": self.score(batch, completion_tokens, completion_mask, 1)}


def pad_rows(rows: list[list[int]], length: int, pad_id: int, left: bool):
  """Pads token rows to `length` -> (tokens (B, length) int32, mask (B, length) bool)."""
  tokens = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, row in enumerate(rows):
    if len(row) > length:
      raise ValueError(f"a row of {len(row)} tokens does not fit the length {length}.")
    sl = slice(length - len(row), length) if left else slice(0, len(row))
    tokens[i, sl] = row
    mask[i, sl] = True
  return tokens, mask


def load_hf_tokenizer(path: str):
  """A checkpoint's own tokenizer (and chat template), from local files only."""
  import json  # noqa: PLC0415
  import os  # noqa: PLC0415

  from grpo_jax.errors import InputError, first_line, json_limit  # noqa: PLC0415
  if not os.path.isdir(path):
    raise InputError(
        f"model.path={path} is not a directory; download a checkpoint first, e.g. "
        f"hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir {path}.")
  # transformers reads config.json too, and would blame a broken one on the tokenizer files.
  config_file = os.path.join(path, "config.json")
  if os.path.isfile(config_file):
    try:
      with open(config_file, "rb") as f:
        json.loads(f.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise InputError(f"{config_file} is not valid JSON ({first_line(e)}); restore the "
                       f"checkpoint's own config.json.") from None
    except (ValueError, RecursionError) as e:  # valid JSON that Python's json cannot read
      raise InputError(f"{config_file} {json_limit(e, fix=False)}; restore the checkpoint's "
                       f"own config.json.") from None
  import transformers  # noqa: PLC0415
  transformers.logging.set_verbosity_error()  # its warnings would break the one-line errors
  try:
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise InputError(
        f"no tokenizer could be loaded from model.path={path} ({str(e).splitlines()[0]}); the "
        f"folder needs the checkpoint's tokenizer files (tokenizer.json, "
        f"tokenizer_config.json).") from None
  # Without its files transformers still returns a tokenizer, of one token, that encodes every
  # text to nothing: a run would train on empty prompts. Refuse one that cannot round-trip
  # a line of task text.
  probe = "Natalia sold 48 clips in April."
  ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
  decoded = tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
  if len(ids) < 2 or "48" not in decoded or tokenizer.eos_token_id is None:
    raise InputError(
        f"the tokenizer in model.path={path} cannot encode task text ({len(tokenizer)} "
        f"token(s) in its vocabulary, {probe!r} -> {len(ids)} ids -> {decoded!r}, eos id "
        f"{tokenizer.eos_token_id}); the folder needs the checkpoint's tokenizer files "
        f"(tokenizer.json, tokenizer_config.json).")
  return tokenizer
