"""GSM8K: local jsonl files or tensorflow-datasets, prompts through the model's chat template,
and host-side scoring of decoded completions.

Records are {"question": str, "answer": "...reasoning...\\n#### 18"}. The prompt is the chat
template applied to one user message: the question, a space, and `data.instruction` (verl's
recipe: 'Let\\'s think step by step and output the final answer after "####".').
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from grpo_jax.data.chat import ChatTextTask, epoch_stream
from grpo_jax.data.task import register_task, reward_name
from grpo_jax.errors import ConfigError, InputError, first_line
from grpo_jax.rewards.gsm8k import flexible_reward, gold_answer, strict_reward
from grpo_jax.rewards.registry import get_reward

VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def load_jsonl(path: str) -> list[dict]:
  """GSM8K records from a jsonl file; a missing or empty file, or a bad line (not UTF-8, not
  JSON, no question/answer, no '#### <number>'), fails naming the file and line."""
  if not os.path.isfile(path):
    raise InputError(f"GSM8K file {path} does not exist; set data.path to a folder holding "
                     f"train.jsonl and test.jsonl (one JSON object per line).")
  records = []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise InputError(f"{path}:{number} is not UTF-8 text (byte {raw[e.start:e.start + 1]!r} "
                         f"at column {e.start + 1}); save the file as UTF-8.") from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise InputError(f"{path}:{number} is not valid JSON ({e.msg}); each line must be one "
                         f"object with 'question' and 'answer'.") from None
      if not (isinstance(record, dict) and isinstance(record.get("question"), str)
              and isinstance(record.get("answer"), str)):
        raise InputError(f"{path}:{number} lacks a string 'question' or 'answer'; each line must "
                         f"be one object with both.")
      try:
        record["gold"] = gold_answer(record["answer"])
      except ValueError as e:
        raise InputError(f"{path}:{number}: {e}") from None
      records.append(record)
  if not records:
    raise InputError(f"GSM8K file {path} holds no records (it is empty or blank); write GSM8K "
                     f"there with python -m grpo_jax.data.fetch_gsm8k --out "
                     f"{os.path.dirname(path) or '.'}, or point data.path at a folder that has it.")
  return records


def load_tfds(split: str, data_dir: str | None = None) -> list[dict]:
  """GSM8K from tensorflow-datasets, prepared already (offline it fails at once, no retries)."""
  try:
    import tensorflow_datasets as tfds
    import tensorflow_datasets.text.gsm8k  # noqa: F401  registers the builder
  except ImportError as e:
    raise InputError(f"data.source='tfds' needs tensorflow-datasets and importlib_resources "
                     f"(pip install -e '.[tfds]'); {first_line(e)}.") from None
  builder = tfds.builder("gsm8k", data_dir=data_dir)
  if not builder.is_prepared():
    where = f"data_dir={data_dir!r}" if data_dir else ""
    raise InputError(
        f"tfds gsm8k is not prepared under {builder.data_dir} (data.tfds_dir="
        f"{data_dir or ''!r}); run once with network access: python -c \"import "
        f"tensorflow_datasets as tfds, tensorflow_datasets.text.gsm8k; tfds.builder('gsm8k'"
        f"{', ' + where if where else ''}).download_and_prepare()\", or use data.source='jsonl'.")
  records = []
  for example in tfds.as_numpy(builder.as_dataset(split=split)):
    question, answer = example["question"].decode(), example["answer"].decode()
    records.append({"question": question, "answer": answer, "gold": gold_answer(answer)})
  return records


@dataclasses.dataclass
class GSM8KPrompts:
  prompt_tokens: np.ndarray  # (B, P) int32, left-padded
  prompt_mask: np.ndarray  # (B, P) bool
  gold: list  # normalised gold answers
  # the user's message (question and instruction), for rewards that read text
  # (grpo_jax/rewards/sources.py: remote servers, reward models with their own template)
  user_text: list = dataclasses.field(default_factory=list)


def _require(condition: bool, message: str) -> None:
  if not condition:
    raise ConfigError(message)


@register_task("gsm8k")
class GSM8KTask(ChatTextTask):
  """Prompts, gold answers and scoring for GSM8K with a Hugging Face tokenizer; "text" rewards
  (grpo_jax.rewards.registry), gsm8k_strict by default."""

  @staticmethod
  def check_config(config) -> None:
    """The GSM8K recipe's requirements, each one sentence with the fix."""
    path = config.model.path
    _require(bool(path), "task.name='gsm8k' needs model.path, a local Hugging Face checkpoint "
             "folder; e.g. hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir "
             "/ckpt/qwen2.5-0.5b-instruct, then --config.model.path=/ckpt/qwen2.5-0.5b-instruct.")
    _require(os.path.isdir(path), f"model.path={path} is not a directory; download the "
             f"checkpoint first, e.g. hf download Qwen/Qwen2.5-0.5B-Instruct "
             f"--local-dir {path}.")
    _require(config.warmup.steps == 0, f"warmup.steps={config.warmup.steps}: the supervised "
             f"warm-up is for the synthetic task only; set warmup.steps=0 for a real checkpoint.")
    get_reward(reward_name(config, "gsm8k_strict"), "text", "gsm8k")
    data = config.data
    _require(data.source in ("jsonl", "tfds"), f"data.source={data.source!r} is unknown; "
             f"valid: jsonl, tfds.")
    if data.source == "jsonl":
      for split in ("train", "test"):
        file = os.path.join(data.path, f"{split}.jsonl")
        _require(os.path.isfile(file), f"data.path={data.path!r} has no {split}.jsonl (looked "
                 f"for {os.path.abspath(file)}); write GSM8K there with python -m "
                 f"grpo_jax.data.fetch_gsm8k --out {data.path} (pip install -e '.[data]', "
                 f"needs network once), or point data.path at a folder with GSM8K's "
                 f"train.jsonl and test.jsonl.")

  @classmethod
  def from_config(cls, config, log=print) -> "GSM8KTask":
    from grpo_jax.data.tokenizer import load_hf_tokenizer  # noqa: PLC0415  transformers
    return cls(config.data, reward_name(config, "gsm8k_strict"),
               load_hf_tokenizer(config.model.path), config.data.max_prompt_tokens,
               config.rollout.max_new_tokens, log, config.reward.format_score)

  batch_class = GSM8KPrompts

  def __init__(self, data_cfg, reward: str, tokenizer, max_prompt_tokens: int,
               max_new_tokens: int, log=print, format_score: float = 0.0):
    self.tokenizer = tokenizer
    self.max_new_tokens = max_new_tokens
    self.prompt_len = max_prompt_tokens
    self.instruction = data_cfg.instruction
    self.use_chat_template = data_cfg.use_chat_template
    self.reward_fn = get_reward(reward, "text", "gsm8k").fn
    self.format_score = format_score
    if data_cfg.source == "jsonl":
      train = load_jsonl(os.path.join(data_cfg.path, "train.jsonl"))
      test = load_jsonl(os.path.join(data_cfg.path, "test.jsonl"))
    elif data_cfg.source == "tfds":
      train, test = load_tfds("train", data_cfg.tfds_dir or None), load_tfds("test",
                                                                               data_cfg.tfds_dir or None)
    else:
      raise ConfigError(f"data.source={data_cfg.source!r} is unknown; valid: jsonl, tfds.")
    self.train, dropped = self._encode_all(train)
    self.test, dropped_test = self._encode_all(test)
    if dropped or dropped_test:
      log(f"gsm8k: dropped {dropped} train and {dropped_test} test prompts longer than "
          f"data.max_prompt_tokens={max_prompt_tokens}")
    if not self.train or not self.test:
      raise ConfigError(f"no GSM8K {'train' if not self.train else 'test'} prompt fits "
                        f"data.max_prompt_tokens={max_prompt_tokens} ({len(train)} train and "
                        f"{len(test)} test records read); raise it.")

  def user_content(self, question: str) -> str:
    return f"{question} {self.instruction}".strip()

  def prompt_text(self, question: str) -> str:
    return self.chat_prompt(self.user_content(question))

  def _encode_all(self, records):
    kept, dropped = [], 0
    for record in records:
      ids = self.tokenizer(self.prompt_text(record["question"]), add_special_tokens=False)[
          "input_ids"]
      if len(ids) > self.prompt_len:
        dropped += 1
        continue
      kept.append((ids, record["gold"], self.user_content(record["question"])))
    return kept, dropped

  def supervised_example(self, prompt: str, response: str) -> tuple[list, list]:
    """(prompt ids, response ids + <eos>): the prompt as a question is formatted (instruction,
    chat template), the response as the assistant's text."""
    ids = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return ids(self.prompt_text(prompt)), ids(response) + [self.eos_id]

  def train_batch(self, position: int, count: int, seed: int) -> GSM8KPrompts:
    """Prompts [position, position + count) of a stream that reshuffles every epoch by
    (seed, epoch), so any position is reproducible without replay."""
    return self._batch([self.train[i]
                        for i in epoch_stream(len(self.train), position, count, seed)])

  def test_batch(self, size: int) -> GSM8KPrompts:
    if size > len(self.test):
      raise ConfigError(f"train.eval_size={size} exceeds the {len(self.test)} GSM8K test "
                        f"prompts that fit data.max_prompt_tokens; lower train.eval_size.")
    return self._batch(self.test[:size])

  def score(self, batch: GSM8KPrompts, completion_tokens, completion_mask, group_size: int):
    """Rewards (B * G,) float32 of the configured reward function; no step rewards."""
    texts = self.decode(completion_tokens, completion_mask)
    golds = np.repeat(np.asarray(batch.gold, dtype=object), group_size)
    rewards = np.array([self.reward_fn(t, g, self.format_score) for t, g in zip(texts, golds)],
                       np.float32)
    if not np.all(np.isfinite(rewards)):
      bad = int(np.flatnonzero(~np.isfinite(rewards))[0])
      raise ValueError(f"reward {self.reward_fn.__name__} returned {rewards[bad]} for "
                       f"completion {texts[bad][:200]!r}; rewards must be finite.")
    return rewards

  def eval_scores(self, batch: GSM8KPrompts, completion_tokens, completion_mask) -> dict:
    """Per-prompt strict and flexible correctness (verl's two GSM8K scores, format_score 0)."""
    texts = self.decode(completion_tokens, completion_mask)
    golds = batch.gold
    return {"eval_accuracy": np.array([strict_reward(t, g) for t, g in zip(texts, golds)],
                                      np.float32),
            "eval_accuracy_flexible": np.array(
                [flexible_reward(t, g) for t, g in zip(texts, golds)], np.float32)}
