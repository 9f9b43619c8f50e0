"""A researcher's own data, from config alone (task.name="table"): rows of a file, a folder or
a 🤗 `datasets` dataset, prompts through the model's chat template, rewards from reward.fns.

data.source is one of
  * a file: .jsonl (one object per line), .json (a list of objects), .parquet or .csv;
  * a folder holding {data.train_split}.<ext> and optionally {data.test_split}.<ext> (the
    extensions above), or a folder written by `datasets`' save_to_disk;
  * otherwise a hub id (e.g. "openai/gsm8k", with data.subset "main"), loaded by `datasets`.

A row's prompt is its data.prompt_field (default "prompt"), or its "messages" column when it
has no such field: a string becomes one user message (data.instruction appended after a
space), a list of {role, content} is taken as is (a final assistant turn dropped); a
data.system_prompt comes first unless the messages have one. The chat template renders them
(data.use_chat_template, when the tokenizer has one; else the contents joined by blank lines).
Every other column reaches the reward functions by name (rewards/functions.py), the
data.answer_field one among them.

The held-out split is data.test_split when the source has it, else a fixed fraction
(data.test_fraction) of the training rows, drawn with a fixed seed so that it does not move
with the experiment's seed, and over the rows' places in the file so that a row skipped (or
fixed) moves no other. The training stream reshuffles every epoch by (seed, epoch), so a
run resumes exactly from its saved position. A bad row (not UTF-8, not JSON, no prompt, an
empty prompt, a prompt longer than data.max_prompt_tokens) stops the run with one sentence
naming the file and line (data.on_bad_row="raise"), or is skipped and counted ("skip").

A row's "images" column (IMAGES_COLUMN; optional) lists its images: paths (relative to the data
file's folder, or absolute), data:image/...;base64 URIs, bytes or `datasets` Image features
(data/images.py). They are decoded to uint8 RGB arrays when the rows are read; one that cannot
be read makes the row a bad row (its file, its line and the image named), never a text-only row.
The column does not reach the reward functions.

With model.vision (a vision-language policy) every row holds exactly one image, resized to
data.image_size pixels square, an image placed before the last user message's text by the chat
template and its placeholder expanded to the image's tokens, and the batches carry the images'
patches as `pixel_values` (data/table_images.py; the task's image_grid and image_token_id are what
the policy is built for). Without model.vision nothing here changes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from grpo_jax.data.chat import ChatPrompts, ChatTextTask, epoch_stream
from grpo_jax.data.images import ImageLoadError, image_dir, load_row_images
from grpo_jax.data.task import check_eval_size, register_task
from grpo_jax.data.table_files import (EXTENSIONS, BadRow, LongPrompt, _file_rows,  # noqa: F401
                                       jsonl_rows, read_splits)
from grpo_jax.data.table_images import image_prompt_ids, table_vision
from grpo_jax.errors import InputError, one_of as _one_of, require as _require
from grpo_jax.rewards.functions import (ANSWER_READERS, answer_match, call_reward,
                                        load_reward_functions)

BAD_ROW_MODES = ("raise", "skip")
_SPLIT_SEED = 1234  # fixed: the held-out fraction must not move with the experiment's seed
IMAGES_COLUMN = "images"


@dataclasses.dataclass
class TablePrompts(ChatPrompts):  # gold: the answer column; user_text: the last user message
  columns: list  # each row's other columns, {name: value}
  # each row's [(H, W, 3) uint8] ([] none; under model.vision its one image, resized)
  images: list = dataclasses.field(default_factory=list)
  # model.vision: (B, patches, C*T*P*P) float32, each row's one image processed; None: text only
  pixel_values: np.ndarray | None = None


@register_task("table")
class TableTask(ChatTextTask):
  """Rows of the user's own data (module docstring), scored by reward.fns. A task built on it
  (GSM8K) overrides `read_rows`, `render` and the class attributes below."""
  batch_class = TablePrompts
  name = "table"  # in log lines
  skip_long_prompts = False  # True: prompts over data.max_prompt_tokens always skipped, counted

  @staticmethod
  def check_config(config) -> None:
    data = config.data
    _require(bool(config.model.path), "task.name='table' needs model.path, a Hugging Face "
             "checkpoint folder with its tokenizer (e.g. python -m grpo_jax.fetch_model "
             "smollm2-135m-instruct --out DIR, then --config.model.path=DIR).")
    _require(data.source not in ("jsonl", "tfds", ""), f"data.source={data.source!r} is "
             f"GSM8K's setting; for task.name='table' set data.source to a "
             f"{'/'.join(EXTENSIONS)} file, a folder of them, a save_to_disk folder or a "
             f"datasets hub id.")
    _one_of(data.on_bad_row, BAD_ROW_MODES, "data.on_bad_row")
    _require(0 < data.test_fraction < 1, f"data.test_fraction={data.test_fraction}; use a "
             f"fraction in (0, 1) of the rows held out when the source has no test split.")
    _require(bool(config.reward.fns.strip()), "task.name='table' scores with reward.fns, which "
             "is empty; name your function (--config.reward.fns=my_module:my_reward) or a "
             "built-in: math_verify, format_regex, answer_number.")
    load_reward_functions(config)

  @classmethod
  def from_config(cls, config, log=print) -> "TableTask":
    from grpo_jax.data.tokenizer import load_hf_tokenizer  # noqa: PLC0415  transformers
    tokenizer = load_hf_tokenizer(config.model.path)
    return cls(config.data, tokenizer, load_reward_functions(config),
               config.rollout.max_new_tokens, log, vision=table_vision(config, tokenizer))

  def __init__(self, data_cfg, tokenizer, rewards, max_new_tokens: int, log=print, vision=None):
    self.tokenizer, self.rewards, self.max_new_tokens = tokenizer, rewards, max_new_tokens
    self.vision = vision  # data/table_images.TableVision under model.vision, else None
    if vision is not None:  # what models/vision/build.py fits the policy to
      self.image_grid, self.image_token_id = vision.image_grid, vision.image_token_id
    self._log = log
    self.data = data_cfg
    self.prompt_len = data_cfg.max_prompt_tokens
    self.use_chat_template = data_cfg.use_chat_template
    self.image_dir = image_dir(data_cfg.source)
    train, test = self.read_rows(data_cfg)
    skipped = {}
    train = self._encode_all(train, skipped)  # None where a row is skipped
    # every column name any row has: each reward call receives them all (None where absent)
    self.column_names = sorted({k for item in train if item for k in item[3]})
    if test is None:  # drawn over the file's rows, skipped ones included: a skip moves no other
      order = np.random.default_rng(_SPLIT_SEED).permutation(len(train))
      held = max(1, int(round(data_cfg.test_fraction * len(train))))
      test = [train[i] for i in order[:held]]
      train = [train[i] for i in sorted(order[held:])]
    else:
      test = self._encode_all(test, skipped)
    self.train, self.test = ([i for i in items if i is not None] for items in (train, test))
    columns = set(self.column_names).union(*(item[3] for item in self.test))
    clash = sorted({"prompts", "completions"} & columns)
    if clash:  # (the reward functions get the columns as keywords after these two)
      raise InputError(f"{self.describe_source(data_cfg)} has a column {clash[0]!r}, the name of "
                       f"the reward functions' own argument; rename that column.")
    if skipped:
      log(f"{self.name}: skipped {sum(skipped.values())} rows: " + "; ".join(
          f"{n} {why}" for why, n in sorted(skipped.items())))
    if not self.train or not self.test:
      raise InputError(f"data.source={data_cfg.source!r} leaves no "
                       f"{'training' if not self.train else 'held-out'} rows ({len(self.train)} "
                       f"train, {len(self.test)} held-out) within data.max_prompt_tokens="
                       f"{self.prompt_len}; add rows or raise it.")
    log(f"{self.name}: {len(self.train)} training and {len(self.test)} held-out prompts from "
        f"{self.describe_source(data_cfg)}")
    if data_cfg.answer_field not in self.column_names:
      log(f"{self.name}: the rows have no answer column data.answer_field="
          f"{data_cfg.answer_field!r}, so the held-out eval_accuracy is the weighted reward "
          f"(eval_reward)")
    readers = [r.name for r in rewards if r.name in ANSWER_READERS]
    if readers and data_cfg.answer_field not in self.column_names:
      raise InputError(f"reward.fns names {', '.join(readers)}, which compares each completion "
                       f"with the answer column data.answer_field={data_cfg.answer_field!r}, "
                       f"but the rows of {self.describe_source(data_cfg)} have no such column "
                       f"(columns: {', '.join(self.column_names) or 'none'}); rename the column "
                       f"or set data.answer_field.")
    # Two rows, so that a function which gets its batch wrong (e.g. always one value) fails
    # here too, before any compute, in one sentence.
    probe = self._batch((self.test * 2)[:2])
    empty = np.zeros((2, 1), np.int32), np.zeros((2, 1), bool)
    for reward in rewards:
      try:
        call_reward(reward, probe.user_text, self.decode(*empty), self._columns(probe, 1))
      except (RuntimeError, ValueError) as e:
        raise InputError(f"{str(e).rstrip('.')}, on a probe call (the first "
                         f"two held-out rows, empty completions); fix it: it must take "
                         f"(prompts, completions, **columns) and return one finite float per "
                         f"completion.") from None

  def read_rows(self, data_cfg):
    """(train rows, test rows or None): lists of (where, row dict or BadRow)."""
    return read_splits(data_cfg.source, data_cfg.train_split, data_cfg.test_split,
                       data_cfg.subset)

  def describe_source(self, data_cfg) -> str:
    return data_cfg.source

  def render(self, messages: list) -> str:
    """The prompt text of a conversation: the tokenizer's chat template (data.use_chat_template,
    when it has one), else the contents joined by blank lines."""
    if self.use_chat_template and getattr(self.tokenizer, "chat_template", None):
      return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages)

  def _messages(self, row: dict) -> list:
    field = self.data.prompt_field
    value = row.get(field, row.get("messages") if field == "prompt" else None)
    if isinstance(value, str):
      instruction = self.data.instruction
      messages = [{"role": "user", "content": f"{value} {instruction}".strip()}]
    elif isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
        for m in value):
      messages = [{"role": m["role"], "content": m["content"]} for m in value]
      if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    else:
      raise BadRow(f"has no prompt: a string {field!r}"
                   + (" or a 'messages' list of {role, content}" if field == "prompt" else "")
                   + f" (its fields: {', '.join(sorted(row)) or 'none'})")
    if not any(m["content"].strip() for m in messages if m["role"] != "system"):
      raise BadRow("has an empty prompt")
    if self.data.system_prompt and messages[0]["role"] != "system":
      messages.insert(0, {"role": "system", "content": self.data.system_prompt})
    return messages

  def _encode(self, row: dict):
    messages = self._messages(row)
    if self.vision is not None:
      ids = image_prompt_ids(self, self.vision, messages)
    else:
      ids = self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]
    if len(ids) > self.prompt_len:
      raise LongPrompt(f"has a prompt of {len(ids)} tokens, more than data.max_prompt_tokens="
                       f"{self.prompt_len}", f"prompts longer than data.max_prompt_tokens="
                       f"{self.prompt_len}")
    user = [m["content"] for m in messages if m["role"] == "user"]
    columns = {k: v for k, v in row.items()
               if k not in (self.data.prompt_field, "messages", IMAGES_COLUMN)}
    answer = row.get(self.data.answer_field)
    item = ids, "" if answer is None else str(answer), user[-1] if user else "", columns
    try:  # (ids, answer, user text, columns[, images])
      images = load_row_images(row.get(IMAGES_COLUMN), self.image_dir)
    except ImageLoadError as e:
      raise BadRow(f"has an image that cannot be read ({e})", "rows with unreadable images"
                   ) from None
    if self.vision is not None:
      return item + ([self.vision.fit(images)],)
    return item + (images,) if images else item

  def _encode_all(self, rows, skipped: dict) -> list:
    out = []
    for where, row in rows:
      try:
        if isinstance(row, BadRow):
          raise row
        out.append(self._encode(row))
      except BadRow as bad:
        if self.data.on_bad_row == "raise" and not (self.skip_long_prompts
                                                   and isinstance(bad, LongPrompt)):
          raise InputError(f"{where} {bad}; fix the row, or set data.on_bad_row='skip' to skip "
                           f"such rows and count them.") from None
        skipped[bad.kind] = skipped.get(bad.kind, 0) + 1
        out.append(None)  # (its place kept for the held-out draw)
    return out

  def _batch(self, items) -> TablePrompts:
    images = [item[4] if len(item) > 4 else [] for item in items]
    pixel_values = (None if self.vision is None else
                    self.vision.pixel_values([row[0] for row in images]))
    return super()._batch(items, [item[3] for item in items], images, pixel_values)

  def train_batch(self, position: int, count: int, seed: int) -> TablePrompts:
    return self._batch([self.train[i]
                        for i in epoch_stream(len(self.train), position, count, seed)])

  def test_batch(self, size: int) -> TablePrompts:
    if size > len(self.test) and self.data.get("fit_eval_size", False):
      if not getattr(self, "_said_fit", False):
        self._log(f"{self.name}: train.eval_size={size} but {len(self.test)} held-out prompts: "
                  f"each evaluation scores those {len(self.test)} (data.fit_eval_size)")
        self._said_fit = True
      size = len(self.test)
    check_eval_size(size, len(self.test), f"the {len(self.test)} held-out prompts of "
                    f"{self.describe_source(self.data)} that fit data.max_prompt_tokens="
                    f"{self.prompt_len}", "lower train.eval_size")
    return self._batch(self.test[:size])

  def _columns(self, batch: TablePrompts, group_size: int) -> dict:
    """{column: one value per completion row} (rows repeated G times; None where absent)."""
    return {k: [row.get(k) for row in batch.columns for _ in range(group_size)]
            for k in self.column_names}

  def _scores(self, batch: TablePrompts, completion_tokens, completion_mask, group_size: int):
    """((B * G,) float32 weighted sum of reward.fns, [(function, its values)])."""
    completions = self.decode(completion_tokens, completion_mask)
    prompts = [p for p in batch.user_text for _ in range(group_size)]
    columns = self._columns(batch, group_size)
    scores = [(r, call_reward(r, prompts, completions, columns)) for r in self.rewards]
    return sum(r.weight * values for r, values in scores).astype(np.float32), scores

  def score(self, batch: TablePrompts, completion_tokens, completion_mask,
            group_size: int) -> np.ndarray:
    """(B * G,) float32: the weighted sum of reward.fns."""
    return self._scores(batch, completion_tokens, completion_mask, group_size)[0]

  def eval_scores(self, batch: TablePrompts, completion_tokens, completion_mask) -> dict:
    """Of one greedy completion per held-out prompt: eval_reward, the weighted reward; with
    several functions also eval_<function> for each; eval_accuracy, whether it gives the
    row's answer (rewards.functions.answer_match, against data.answer_field) — where the rows
    have no answer column, the weighted reward again (said once when the task is built)."""
    reward, scores = self._scores(batch, completion_tokens, completion_mask, 1)
    out = {"eval_accuracy": reward, "eval_reward": reward}
    answers = [row.get(self.data.answer_field) for row in batch.columns]
    if self.data.answer_field in self.column_names:
      completions = self.decode(completion_tokens, completion_mask)
      out["eval_accuracy"] = np.asarray([0.0 if a is None else answer_match(c, a)
                                         for c, a in zip(completions, answers)], np.float32)
    if len(scores) > 1:
      out.update({f"eval_{r.name.rpartition(':')[2]}": v.astype(np.float32) for r, v in scores})
    return out
