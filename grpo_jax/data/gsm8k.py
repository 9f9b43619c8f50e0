"""GSM8K: the table task (grpo_jax/data/table.py) on GSM8K's rows, scored by verl's rules.

Records are {"question": str, "answer": "...reasoning...\\n#### 18"}, from data.path/{train,
test}.jsonl (data.source "jsonl") or prepared tensorflow-datasets ("tfds"). What differs from
a researcher's own table: the prompt is the "question" column (data.instruction appended, verl's
'Let\'s think step by step and output the final answer after "####".' in the recipe), the gold
answer is the number after the answer's "####", a record without one stops the run naming its
file and line, prompts longer than data.max_prompt_tokens are dropped and counted (verl's
filter_overlong_prompts), training scores with a "text" reward (gsm8k_strict by default) and
evaluation reports verl's strict and flexible accuracy.
"""

from __future__ import annotations

import os

import numpy as np

from grpo_jax.data.table import TableTask, jsonl_rows
from grpo_jax.data.task import register_task, reward_name
from grpo_jax.errors import (ConfigError, InputError, first_line, one_of as _one_of,
                             require as _require)
from grpo_jax.rewards.functions import RewardFunction
from grpo_jax.rewards.gsm8k import flexible_reward, gold_answer, strict_reward
from grpo_jax.rewards.registry import get_reward

VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def records(path: str):
  """(where "file:line", record) of a GSM8K jsonl file, each record with its "gold" answer; a
  missing or empty file, or a bad line (not UTF-8, not JSON, no question/answer, no
  '#### <number>'), fails naming the file and line."""
  if not os.path.isfile(path):
    raise InputError(f"GSM8K file {path} does not exist; set data.path to a folder holding "
                     f"train.jsonl and test.jsonl (one JSON object per line).")
  out = []
  for where, record in jsonl_rows(path):
    if isinstance(record, Exception):
      raise InputError(f"{where} {record}.")
    if not (isinstance(record.get("question"), str) and isinstance(record.get("answer"), str)):
      raise InputError(f"{where} lacks a string 'question' or 'answer'; each line must be one "
                       f"object with both.")
    try:
      record["gold"] = gold_answer(record["answer"])
    except ValueError as e:
      raise InputError(f"{where}: {e}") from None
    out.append((where, record))
  if not out:
    raise InputError(f"GSM8K file {path} holds no records (it is empty or blank); write GSM8K "
                     f"there with python -m grpo_jax.data.fetch_gsm8k --out "
                     f"{os.path.dirname(path) or '.'}, or point data.path at a folder that has it.")
  return out


def load_jsonl(path: str) -> list[dict]:
  """GSM8K records of a jsonl file (`records`, without where they come from)."""
  return [record for _, record in records(path)]


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
  out = []
  for example in tfds.as_numpy(builder.as_dataset(split=split)):
    question, answer = example["question"].decode(), example["answer"].decode()
    out.append({"question": question, "answer": answer, "gold": gold_answer(answer)})
  return out


@register_task("gsm8k", capabilities=("supervised",))
class GSM8KTask(TableTask):
  """GSM8K's rows through the table task (module docstring); "text" rewards
  (grpo_jax.rewards.registry), gsm8k_strict by default."""
  name = "gsm8k"
  skip_long_prompts = True

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
    get_reward(reward_name(config, "gsm8k_strict"), "text", "gsm8k")
    data = config.data
    _one_of(data.source, ("jsonl", "tfds"), "data.source")
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
    data = config.data.copy_and_resolve_references()
    data.update(dict(prompt_field="question", answer_field="gold", on_bad_row="raise"))
    reward = get_reward(reward_name(config, "gsm8k_strict"), "text", "gsm8k").fn
    format_score = config.reward.format_score

    def score(prompts, completions, *, gold, **_):
      return [reward(c, g, format_score) for c, g in zip(completions, gold)]
    task = cls(data, load_hf_tokenizer(config.model.path),
               (RewardFunction(reward.__name__, score, 1.0),), config.rollout.max_new_tokens, log)
    task.reward_fn, task.format_score = reward, format_score
    return task

  def read_rows(self, data_cfg):
    if data_cfg.source == "jsonl":
      return tuple(records(os.path.join(data_cfg.path, f"{split}.jsonl"))
                   for split in ("train", "test"))
    if data_cfg.source == "tfds":
      return tuple([(f"tfds gsm8k[{split}] row {i}", r) for i, r in enumerate(
          load_tfds(split, data_cfg.tfds_dir or None))] for split in ("train", "test"))
    raise ConfigError(f"data.source={data_cfg.source!r} is unknown; valid: jsonl, tfds.")

  def describe_source(self, data_cfg) -> str:
    return data_cfg.path if data_cfg.source == "jsonl" else "tfds"

  def render(self, messages: list) -> str:
    """The chat template around the messages; without one, a lone question as
    "Question: ...\\nAnswer:"."""
    if len(messages) == 1:
      return self.chat_prompt(messages[0]["content"])
    return super().render(messages)

  def supervised_example(self, prompt: str, response: str) -> tuple[list, list]:
    """(prompt ids, response ids + <eos>): the prompt as a question is formatted (instruction,
    chat template), the response as the assistant's text."""
    ids = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return (ids(self.render(self._messages({"question": prompt}))),
            ids(response) + [self.eos_id])

  def eval_scores(self, batch, completion_tokens, completion_mask) -> dict:
    """Per-prompt strict and flexible correctness (verl's two GSM8K scores, format_score 0)."""
    texts = self.decode(completion_tokens, completion_mask)
    golds = batch.gold
    return {"eval_accuracy": np.array([strict_reward(t, g) for t, g in zip(texts, golds)],
                                      np.float32),
            "eval_accuracy_flexible": np.array(
                [flexible_reward(t, g) for t, g in zip(texts, golds)], np.float32)}
