"""Data of the supervised stages: jsonl files of `{prompt, response}` (SFT) and of `{prompt,
chosen, rejected}` (reward-model training, Bradley-Terry), tokenised by the task
(`Task.supervised_example(prompt, response) -> (prompt ids, response ids)`: the task's own
prompt format, the response ending with <eos>), and batches drawn in a per-epoch permutation of
(seed, epoch) so that any position is reproducible (resume without replay).

For the addition task, `addition_preference_pairs` writes such pairs without any file: the
correct answer against a wrong one of the kinds a policy makes (carries dropped, one digit
off, an answer cut short).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import NamedTuple, Optional

import numpy as np

from grpo_jax.data.chat import epoch_stream
from grpo_jax.data.table_files import BadRow
from grpo_jax.data.tokenizer import pad_rows
from grpo_jax.unicode_text import lone_surrogate, surrogate_sentence
from grpo_jax.errors import InputError, json_limit


@dataclasses.dataclass
class SupervisedBatch:
  prompt_tokens: np.ndarray  # (B, P) left-padded
  prompt_mask: np.ndarray
  target_tokens: np.ndarray  # (B, N) right-padded, ending with <eos>
  target_mask: np.ndarray
  # (B, N) the target tokens that carry loss, when not all of them do (an episode's
  # environment tokens: data/env_task.py with task.warmup_loss="assistant"); None: target_mask
  loss_mask: Optional[np.ndarray] = None


class PairBatch(NamedTuple):  # (a pytree: jitted steps take it whole)
  prompt_tokens: np.ndarray  # (B, P) left-padded
  prompt_mask: np.ndarray
  chosen_tokens: np.ndarray  # (B, N) right-padded
  chosen_mask: np.ndarray
  rejected_tokens: np.ndarray  # (B, N)
  rejected_mask: np.ndarray


class LabelledBatch(NamedTuple):  # KTO's unpaired completions
  prompt_tokens: np.ndarray  # (B, P) left-padded
  prompt_mask: np.ndarray
  tokens: np.ndarray  # (B, N) right-padded
  mask: np.ndarray
  desirable: np.ndarray  # (B,) bool: the completion's label


def check_jsonl_file(path: str, needs: str, name: str = "") -> None:
  """InputError, in one sentence naming `name` (the config field) and `path`, unless `path` is
  a file this user can read; `needs` says what each line holds."""
  where = f"{name}={path}" if name else path
  if not os.path.exists(path):
    raise InputError(f"{where}: no such file; give a jsonl file with one JSON object per line "
                     f"holding {needs}.")
  if os.path.isdir(path):
    raise InputError(f"{where} is a folder, not a file; give a jsonl file, one JSON object "
                     f"per line holding {needs}.")
  if not os.path.isfile(path):
    raise InputError(f"{where} is not a regular file; give a jsonl file with one JSON object "
                     f"per line holding {needs}.")
  if not os.access(path, os.R_OK):
    raise InputError(f"{where} is not readable by this user; fix its permissions (chmod u+r "
                     f"{path}) or give another file.")


def jsonl_lines(path: str, needs: str, name: str = "", digest=None):
  """(line number, JSON value) of each non-blank line of a jsonl file, read as UTF-8 (a UTF-8
  BOM at its start allowed); an InputError names the file and the line of bytes that are not
  UTF-8 or of text that is not JSON (`check_jsonl_file` first). `digest`, a hashlib object, is
  fed every byte read (the run record's fingerprint of the file)."""
  check_jsonl_file(path, needs, name)
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      if digest is not None:
        digest.update(raw)
      try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
      except UnicodeDecodeError as e:
        raise InputError(f"{path} line {number} is not UTF-8 text (byte 0x{raw[e.start]:02x} "
                         f"at byte {e.start + 1} of the line); save the file as UTF-8.") from None
      if not line.strip():
        continue
      try:
        value = json.loads(line)
      except json.JSONDecodeError as e:
        raise InputError(f"{path} line {number} is not JSON ({e.msg}); fix that line.") from None
      except (ValueError, RecursionError) as e:  # valid JSON that Python's json cannot read
        raise InputError(f"{path} line {number} {json_limit(e)}.") from None
      found = lone_surrogate(value)
      if found is not None:
        raise InputError(f"{path} line {number} {surrogate_sentence(found)}; fix that line.")
      yield number, value


class FileRecords(list):
  """A jsonl file's records (`read_jsonl`), each knowing its line: `where(i)` -> "PATH line N"."""

  def __init__(self, path: str, numbered: list):
    super().__init__(record for _, record in numbered)
    self.path, self.lines = path, [number for number, _ in numbered]

  def where(self, i: int) -> str:
    return f"{self.path} line {self.lines[i]}"


def read_jsonl(path: str, fields: tuple, name: str = "") -> FileRecords:
  """The records of a jsonl file, each with string `fields`; an InputError names the file and
  the line (`jsonl_lines`); `name`: the config field that gave the path, for the messages."""
  needs = ", ".join(fields)
  numbered = []
  for number, record in jsonl_lines(path, needs, name):
    missing = [k for k in fields
               if not isinstance(record, dict) or not isinstance(record.get(k), str)]
    if missing:
      raise InputError(f"{path} line {number} lacks the string field(s) {', '.join(missing)};"
                       f" each line needs {needs}.")
    numbered.append((number, record))
  if not numbered:
    raise InputError(f"{path} holds no records; each line needs {needs}.")
  return FileRecords(path, numbered)


def encode_example(task, where: str, prompt: str, completion: str, which: str = "response"):
  """task.supervised_example(prompt, completion), or an InputError naming `where` (the file and
  the line), the field (`which`, or the prompt) and the tokenizer's complaint (the character
  it cannot encode)."""
  try:
    return task.supervised_example(prompt, completion)
  except BadRow as e:  # the task's own check of the prompt (GSM8K's: not blank)
    raise InputError(f"{where} {e}; rewrite or remove that line.") from None
  except ValueError as e:
    try:
      task.supervised_example(prompt, "")
      field = which
    except ValueError:
      field = "prompt"
    said = (str(e).strip().splitlines() or [type(e).__name__])[0]
    said = said if len(said) <= 200 else said[:197] + "..."
    raise InputError(f"{where}: the {field} cannot be tokenised ({said}); rewrite or remove "
                     f"that line, or use a model whose tokenizer covers it.") from None


def check_prompt_tokens(where: str, tokens: int, max_prompt_tokens: int) -> None:
  """InputError when the prompt at `where` (a file and its line) has more `tokens` than
  data.max_prompt_tokens, the limit every file-backed stage holds its prompts to (SFT, RM, DPO;
  the RL tasks' rows: data/table.py)."""
  if tokens > max_prompt_tokens:
    raise InputError(f"{where} has a prompt of {tokens} tokens, more than "
                     f"data.max_prompt_tokens={max_prompt_tokens}; shorten or remove that line, "
                     f"or raise data.max_prompt_tokens.")


def check_prompt_positions(where: str, tokens: int, max_new_tokens: int,
                           max_positions: int) -> None:
  """InputError when the prompt at `where` (a file and its line), of `tokens` tokens, with
  rollout.max_new_tokens needs more positions than the model's max_position_embeddings (0: no
  limit); once the model is built."""
  positions = tokens + max_new_tokens
  if max_positions and positions > max_positions:
    raise InputError(f"{where} has a prompt of {tokens} tokens, which with "
                     f"rollout.max_new_tokens={max_new_tokens} needs {positions} positions, more "
                     f"than the model's max_position_embeddings={max_positions}; shorten or "
                     f"remove that line, or lower rollout.max_new_tokens.")


def _where(records):
  """where(i) of records read from a file (FileRecords), else "record i + 1" (records a stage
  made itself)."""
  return getattr(records, "where", lambda i: f"record {i + 1}")


def write_jsonl(path: str, records: list[dict]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


class SupervisedData:
  """{prompt, response} records tokenised by `task`, each prompt within data.max_prompt_tokens
  (`check_prompt_tokens`): `warmup_batch(step, count, seed, _)` as the warm-up asks of a task
  (grpo_jax/train/stages/warmup.py). `longest` is where the longest prompt is (its first
  record), for `check_fits_positions` once the model is built."""

  def __init__(self, task, records: list[dict], max_new_tokens: int, max_prompt_tokens: int):
    where = _where(records)
    self.examples = [encode_example(task, where(i), r["prompt"], r["response"])
                     for i, r in enumerate(records)]
    for i, (prompt, _) in enumerate(self.examples):
      check_prompt_tokens(where(i), len(prompt), max_prompt_tokens)
    self.prompt_len = max(len(p) for p, _ in self.examples)
    self.longest = where(next(i for i, (p, _) in enumerate(self.examples)
                              if len(p) == self.prompt_len))
    self.max_new_tokens = max_new_tokens
    self.pad_id = task.pad_id

  def check_fits_positions(self, max_positions: int) -> None:
    """InputError naming the longest prompt's line when it with rollout.max_new_tokens needs
    more than the model's `max_positions` (`check_prompt_positions`)."""
    check_prompt_positions(self.longest, self.prompt_len, self.max_new_tokens, max_positions)

  def batch(self, rows) -> SupervisedBatch:
    prompts = [self.examples[i][0] for i in rows]
    targets = [self.examples[i][1][:self.max_new_tokens] for i in rows]
    pt, pm = pad_rows(prompts, self.prompt_len, self.pad_id, left=True)
    tt, tm = pad_rows(targets, self.max_new_tokens, self.pad_id, left=False)
    return SupervisedBatch(pt, pm, tt, tm)

  def warmup_batch(self, step: int, count: int, seed: int, carry_drop_fraction=None):
    del carry_drop_fraction  # (the addition task's noise; a file has its own answers)
    return self.batch(epoch_stream(len(self.examples), step * count, count, seed))


class PairData:
  """{prompt, chosen, rejected} records tokenised by `task`, as PairBatch rows."""

  def __init__(self, task, records: list[dict], max_new_tokens: int):
    where = _where(records)
    self.pairs = [(encode_example(task, where(i), r["prompt"], r["chosen"], "chosen"),
                   encode_example(task, where(i), r["prompt"], r["rejected"], "rejected")[1])
                  for i, r in enumerate(records)]
    self.prompt_len = max(len(p) for (p, _), _ in self.pairs)
    self.max_new_tokens = max_new_tokens
    self.pad_id = task.pad_id

  @classmethod
  def tokenized(cls, pairs: list, max_new_tokens: int, pad_id: int) -> "PairData":
    """From pairs already tokenised as this class keeps them: ((prompt ids, chosen ids),
    rejected ids) (grpo_jax/data/preference_files.py)."""
    data = cls.__new__(cls)
    data.pairs, data.max_new_tokens, data.pad_id = list(pairs), max_new_tokens, pad_id
    data.prompt_len = max(len(p) for (p, _), _ in data.pairs)
    return data

  def __len__(self) -> int:
    return len(self.pairs)

  def batch(self, rows) -> PairBatch:
    n, pad = self.max_new_tokens, self.pad_id
    pt, pm = pad_rows([self.pairs[i][0][0] for i in rows], self.prompt_len, pad, left=True)
    ct, cm = pad_rows([self.pairs[i][0][1][:n] for i in rows], n, pad, left=False)
    rt, rm = pad_rows([self.pairs[i][1][:n] for i in rows], n, pad, left=False)
    return PairBatch(pt, pm, ct, cm, rt, rm)

  def stream_batch(self, position: int, count: int, seed: int) -> PairBatch:
    return self.batch(epoch_stream(len(self.pairs), position, count, seed))


class LabelledData:
  """{prompt, completion, label} records tokenised (grpo_jax/data/preference_files.py), as
  LabelledBatch rows."""

  def __init__(self, rows: list, labels: list, max_new_tokens: int, pad_id: int):
    """From rows already tokenised: (prompt ids, completion ids), and their labels."""
    self.rows, self.labels = list(rows), np.array(labels, bool)
    self.max_new_tokens, self.pad_id = max_new_tokens, pad_id
    self.prompt_len = max(len(p) for p, _ in self.rows)

  def __len__(self) -> int:
    return len(self.rows)

  def batch(self, rows) -> LabelledBatch:
    n, pad = self.max_new_tokens, self.pad_id
    pt, pm = pad_rows([self.rows[i][0] for i in rows], self.prompt_len, pad, left=True)
    ct, cm = pad_rows([self.rows[i][1][:n] for i in rows], n, pad, left=False)
    return LabelledBatch(pt, pm, ct, cm, self.labels[np.asarray(rows)])


def _wrong_answer(rng, a: int, b: int, digits: int) -> int:
  """A wrong sum of a + b of the kinds a policy makes: carries dropped, one digit off, or a
  random sum (each a third of the time, falling through when it happens to be right)."""
  from grpo_jax.data.arithmetic import drop_carries  # noqa: PLC0415
  right = a + b
  kind = rng.integers(3)
  if kind == 0:
    wrong = int(drop_carries(np.array([a]), np.array([b]))[0])
    if wrong != right:
      return wrong
  if kind <= 1:
    place = 10 ** int(rng.integers(digits + 1))
    digit = (right // place) % 10
    wrong = right + (int(rng.integers(1, 10)) + digit) % 10 * place - digit * place
    if wrong != right and wrong < 10 ** (digits + 1):
      return wrong
  while True:
    wrong = int(rng.integers(2 * 10 ** digits - 1))
    if wrong != right:
      return wrong


def addition_preference_pairs(task, split: str, count: int, seed: int) -> list[dict]:
  """`count` {prompt, chosen, rejected} text records on the addition task's `split` ("train"
  problems from the seed's training stream, "test" the held-out ones): chosen the right answer,
  rejected a wrong one (`_wrong_answer`), one in 10 of them also cut short (no <eos> in the
  text is impossible, so: its last digit dropped)."""
  rng = np.random.default_rng([seed, 11, 0 if split == "train" else 1])
  operands = (task.train_operands(0, count, seed + 2) if split == "train"
              else task.test_pairs[np.arange(count) % len(task.test_pairs)])
  d = task.num_digits if task.fixed_width else 0
  records = []
  for a, b in operands.tolist():
    wrong = _wrong_answer(rng, a, b, task.num_digits)
    answer = lambda s: f"{s:0{d + 1 if d else 0}d}"  # noqa: E731
    show = (lambda t: t[::-1]) if task.reverse_answer else (lambda t: t)  # noqa: E731
    rejected = show(answer(wrong))
    if rng.random() < 0.1:
      rejected = show(answer(a + b))[:-1]
    records.append({"prompt": f"{a:0{d}d}+{b:0{d}d}=", "chosen": show(answer(a + b)),
                    "rejected": rejected})
  return records
