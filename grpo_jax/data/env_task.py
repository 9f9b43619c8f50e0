"""The task of an environment's episodes (task.name="env"): its rows, its prompts as the chat
template renders the first messages, and its supervised warm-up from the environment's
demonstrations. The environment is config.env (env.name and its keyword-only fields, bound
like every registry's entries); its episodes are played by the "episodes" experience source
(train/sources/episodes.py) and the held-out evaluation (train/run/evaluation.py).

Fields (config.task): tokenizer ("": model.path's; "char": the character-level chat tokenizer,
envs/char_tokenizer.py), test_size (held-out rows), prompt_width (the prompts' padded width,
in tokens), warmup_tool_share (the share of warm-up demonstrations that call the tool; the rest
answer directly), warmup_loss ("episode": the warm-up's loss on every token after the prompt,
the tool's results included; "assistant": only on the tokens the policy writes, the
environment's being context, as in the RL step's action mask). config.env.max_completion_tokens
is an episode's budget of ids after the prompt (the policy's and the environment's).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from grpo_jax.data.chat import ChatTextTask, epoch_stream
from grpo_jax.data.task import check_eval_size, register_task
from grpo_jax.data.tokenizer import pad_rows
from grpo_jax.envs import ENVIRONMENTS
from grpo_jax.envs.chat import render
from grpo_jax.errors import ConfigError

_TRAIN_ROWS = 100_000


@dataclasses.dataclass
class EpisodeBatch:
  prompt_tokens: np.ndarray  # (B, P) left-padded: the first messages and the generation prompt
  prompt_mask: np.ndarray
  rows: list  # the environment's rows
  user_text: list  # the first messages' text


def held_out_left_out(train: list, test: list) -> list:
  """The training rows without any that equals a held-out row (compared as sorted JSON), so
  that no held-out problem is ever trained on, whatever the environment's splits draw."""
  def key(row):
    return json.dumps(row, sort_keys=True, default=repr)
  held_out = {key(row) for row in test}
  kept = [row for row in train if key(row) not in held_out]
  if train and not kept:
    raise ConfigError(f"every one of the environment's {len(train)} training rows is also a "
                      f"held-out row (task.test_size={len(test)}); lower task.test_size or "
                      f"give the environment more problems (e.g. env.digits).")
  return kept


@register_task("env", capabilities=("episodes", "warmup"))
class EnvTask(ChatTextTask):
  """An environment's episodes as a task (see the module docstring); eos / pad ids and the
  prompts' text as every chat task's (data/chat.py)."""

  def __init__(self, env, tokenizer, test_size: int, max_prompt_tokens: int,
               max_completion_tokens: int, warmup_tool_share: float,
               warmup_loss: str = "episode"):
    self.env, self.tokenizer = env, tokenizer
    self.warmup_loss = warmup_loss
    self.test_size, self.prompt_len = test_size, max_prompt_tokens
    self.max_completion_tokens, self.warmup_tool_share = max_completion_tokens, warmup_tool_share
    self._test = env.rows("test", test_size)
    self._train = held_out_left_out(env.rows("train", _TRAIN_ROWS), self._test)
    self.max_new_tokens = max_completion_tokens  # (the evaluation's completion width)
    self.kv_continuation = False  # env.kv_continuation (rollout/continuation.py)
    self.async_slots = 0  # env.async_slots (rollout/episodes/async_turns.py)

  @staticmethod
  def check_config(config) -> None:
    source = config.train.experience_source
    if source not in ("episodes", "fused_episodes"):
      raise ConfigError(f"task.name='env' plays an environment's episodes, which the "
                        f"'episodes' experience source samples (or 'fused_episodes', in one "
                        f"jit); set train.experience_source='episodes' (it is {source!r}).")
    if "env" not in config:
      raise ConfigError("task.name='env' needs a config.env section (env.name and the "
                        "environment's fields); see configs/grpo_calculator_tiny.py.")
    ENVIRONMENTS.get(config.env.name)
    slots = config.env.get("async_slots", 0)
    if not isinstance(slots, int) or slots < 0:
      raise ConfigError(f"env.async_slots={slots!r} is the decode slots of asynchronous turns; "
                        f"set a whole number >= 0 (0: lock-step turns).")
    if slots and source == "fused_episodes":
      raise ConfigError(f"env.async_slots={slots} schedules host tools' episodes, but "
                        f"train.experience_source='fused_episodes' plays them in one jit with "
                        f"no tool to wait on; set env.async_slots=0.")
    env = config.env
    for name in ("max_turns", "max_concurrency", "max_completion_tokens"):
      value = env.get(name, 1)
      if not isinstance(value, int) or value < 1:  # 0 would run on nothing
        raise ConfigError(f"env.{name}={value!r}; use a whole number >= 1 (0 would play "
                          f"episodes of no turn, with no thread, or of no token).")
    if source == "fused_episodes":  # checked before the warm-up
      from grpo_jax.envs import jax_form, jax_form_names  # noqa: PLC0415
      if jax_form(env.name) is None:
        raise ConfigError(f"train.experience_source='fused_episodes' has no JAX form of the "
                          f"environment {env.name!r} (it has: "
                          f"{', '.join(jax_form_names())}); use "
                          f"train.experience_source='episodes'.")
      if config.task.get("tokenizer") != "char" or env.get("tool_parser") != "pythonic":
          raise ConfigError("train.experience_source='fused_episodes' reads turns one character "
                          "per id in the pythonic call format; set task.tokenizer='char' and "
                          "env.tool_parser='pythonic'.")

  @classmethod
  def from_config(cls, config, log=print, *, tokenizer: str = "", test_size: int = 500,
                  prompt_width: int = 128, warmup_tool_share: float = 1.0,
                  warmup_loss: str = "episode"):
    if warmup_loss not in ("episode", "assistant"):
      raise ConfigError(f"task.warmup_loss={warmup_loss!r}; use 'episode' (every token after "
                        f"the prompt, the tool's results included) or 'assistant' (only the "
                        f"tokens the policy writes).")
    env = ENVIRONMENTS.bind(config.env.name, config.env)()
    if tokenizer == "char":
      from grpo_jax.envs.char_tokenizer import char_chat_tokenizer  # noqa: PLC0415
      tok = char_chat_tokenizer()
    else:
      path = tokenizer or config.model.path
      if not path:
        raise ConfigError("task.tokenizer='' reads model.path's tokenizer, but model.path is "
                          "empty; set task.tokenizer='char' for a random model.")
      from transformers import AutoTokenizer  # noqa: PLC0415
      tok = AutoTokenizer.from_pretrained(path)
    task = cls(env, tok, int(test_size), int(prompt_width),
               int(config.env.get("max_completion_tokens", 256)), float(warmup_tool_share),
               warmup_loss)
    task.kv_continuation = bool(config.env.get("kv_continuation", False))
    task.async_slots = int(config.env.get("async_slots", 0))
    return task

  # What the environment's first messages are, as ids.
  def first_messages(self, row, seed: int = 0) -> list:
    return self.env.reset(row, seed)[1]

  def prompt_ids(self, messages: list) -> list[int]:
    text = render(self.tokenizer, messages, self.env.tools, add_generation_prompt=True)
    ids = self.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > self.prompt_len:
      raise ConfigError(f"an episode's first messages take {len(ids)} tokens, more than "
                        f"task.prompt_width={self.prompt_len}; raise it.")
    return ids

  def prompt_batch(self, rows: list) -> EpisodeBatch:
    messages = [self.first_messages(r) for r in rows]
    tokens, mask = pad_rows([self.prompt_ids(m) for m in messages], self.prompt_len,
                            self.pad_id, left=True)
    return EpisodeBatch(tokens, mask, list(rows),
                        ["\n".join(m["content"] for m in ms) for ms in messages])

  def train_rows(self, position: int, count: int, seed: int) -> list:
    return [self._train[i] for i in epoch_stream(len(self._train), position, count, seed)]

  def train_batch(self, position: int, count: int, seed: int) -> EpisodeBatch:
    return self.prompt_batch(self.train_rows(position, count, seed))

  def test_batch(self, size: int) -> EpisodeBatch:
    check_eval_size(size, len(self._test), f"task.test_size={len(self._test)} held-out rows")
    return self.prompt_batch(self._test[:size])

  def warmup_batch(self, step: int, count: int, seed: int, carry_drop_fraction=None):
    """Demonstrations of solved episodes (env.demonstration): the first messages as the prompt,
    the rest of the rendered episode as the target (its tool results included, as text)."""
    del carry_drop_fraction  # (the addition task's noise)
    from grpo_jax.data.supervised import SupervisedBatch  # noqa: PLC0415
    rows = self.train_rows(step * count, count, seed + 1)
    use_tool = np.random.default_rng([seed, 13, step]).random(count) < self.warmup_tool_share
    assistant_only = self.warmup_loss == "assistant"
    prompts, targets, losses = [], [], []
    for row, tool in zip(rows, use_tool):
      first = self.first_messages(row)
      head = render(self.tokenizer, first, self.env.tools, add_generation_prompt=True)
      demo = self.env.demonstration(row, bool(tool))
      whole = render(self.tokenizer, first + demo, self.env.tools)
      prompts.append(self.prompt_ids(first))
      # The rendered episode ends with the last turn's end-of-turn token and a newline: the
      # target stops at that token, as a sampled turn does.
      rest = self.tokenizer.encode(whole[len(head):], add_special_tokens=False)
      ends = [i for i, t in enumerate(rest) if t == self.eos_id]
      targets.append(rest[:ends[-1] + 1] if ends else rest)
      if assistant_only:
        losses.append(self._assistant_tokens(first, demo, head, targets[-1]))
    pt, pm = pad_rows(prompts, self.prompt_len, self.pad_id, left=True)
    longest = max(len(t) for t in targets)
    if longest > self.max_completion_tokens:  # named here, before pad_rows
      raise ConfigError(f"a demonstration episode of the warm-up takes {longest} tokens after "
                        f"its prompt, more than env.max_completion_tokens="
                        f"{self.max_completion_tokens}; raise it (an episode's every turn and "
                        f"tool result must fit).")
    tt, tm = pad_rows(targets, self.max_completion_tokens, self.pad_id, left=False)
    lm = None
    if assistant_only:
      lm = np.zeros_like(tm)
      for i, marks in enumerate(losses):
        lm[i, :len(marks)] = marks[:lm.shape[1]]
      lm = lm * tm
    return SupervisedBatch(pt, pm, tt, tm, lm)

  def _assistant_tokens(self, first: list, demo: list, head: str, target: list) -> list[int]:
    """1 for each target token the policy writes, 0 for the environment's (what follows the
    policy's end-of-turn token: a tool message and the next turn's header, as the RL step's
    action mask has them): the rendered prefixes' lengths in tokens mark the messages."""
    def tokens_to(messages, generation_prompt):
      text = render(self.tokenizer, first + messages, self.env.tools,
                    add_generation_prompt=generation_prompt)
      return len(self.tokenizer.encode(text[len(head):], add_special_tokens=False))
    marks = [1] * len(target)
    for k, message in enumerate(demo):
      if message["role"] != "assistant":
        start = tokens_to(demo[:k], False)
        while start > 0 and target[start - 1] != self.eos_id:  # (the template's newline)
          start -= 1
        end = tokens_to(demo[:k + 1], k + 1 < len(demo))
        marks[start:end] = [0] * len(marks[start:end])
    return marks

  # The Task protocol's single-completion side, which an episode task does not have.
  def score(self, prompts, completion_tokens, completion_mask, group_size: int):
    raise ConfigError("task.name='env' is scored by its environment's episodes; set "
                      "train.experience_source='episodes'.")

  eval_scores = score

  def labels(self, batch) -> list[str]:
    return [str(r) for r in batch.rows]

  def decode(self, completion_tokens, completion_mask) -> list[str]:
    tokens, mask = np.asarray(completion_tokens), np.asarray(completion_mask, bool)
    return [self.tokenizer.decode(t[m].tolist(), skip_special_tokens=False)
            for t, m in zip(tokens, mask)]
