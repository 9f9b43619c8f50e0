"""What the text tasks on a Hugging Face tokenizer share (gsm8k, chat_arithmetic): a user
message in the tokenizer's chat template, eos / pad ids, batches of left-padded prompts with
their gold answers and user text, decoding, and a training stream reshuffled every epoch."""

from __future__ import annotations

import dataclasses

import numpy as np

from grpo_jax.data.tokenizer import pad_rows


def epoch_stream(num: int, position: int, count: int, seed: int) -> list[int]:
  """Indices [position, position + count) of a stream over `num` items that reshuffles every
  epoch by (seed, epoch): any position is reproducible without replay."""
  out = []
  while len(out) < count:
    epoch, offset = divmod(position + len(out), num)
    perm = np.random.default_rng([seed, epoch]).permutation(num)
    out.extend(int(i) for i in perm[offset:offset + count - len(out)])
  return out


@dataclasses.dataclass
class ChatPrompts:
  prompt_tokens: np.ndarray  # (B, P) int32, left-padded
  prompt_mask: np.ndarray  # (B, P) bool
  gold: list  # the gold answers, as text ("" without one)
  user_text: list  # the user's (last) message: what rewards reading text receive as the prompt


class ChatTextTask:
  """A mixin: needs `tokenizer`, `use_chat_template` and `prompt_len`; its batches are
  `batch_class`, ChatPrompts or a dataclass that extends it."""
  batch_class = ChatPrompts

  def chat_prompt(self, user: str) -> str:
    """The chat template around one user message (or "Question: ...\\nAnswer:" without one)."""
    if self.use_chat_template and getattr(self.tokenizer, "chat_template", None):
      return self.tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                                tokenize=False, add_generation_prompt=True)
    return f"Question: {user}\nAnswer:"

  @property
  def eos_id(self) -> int:
    return self.tokenizer.eos_token_id

  @property
  def pad_id(self) -> int:
    pad = self.tokenizer.pad_token_id
    return self.eos_id if pad is None else pad

  def _batch(self, items, *extra):
    """items (prompt ids, gold, user text, ...) -> a batch, left-padded to prompt_len; `extra`:
    the values of batch_class's further fields."""
    tokens, mask = pad_rows([item[0] for item in items], self.prompt_len, self.pad_id, left=True)
    return self.batch_class(tokens, mask, [item[1] for item in items],
                            [item[2] for item in items], *extra)

  def prompt_texts(self, batch) -> list[str]:
    """The user's messages (without the policy's chat markup), for rewards reading text."""
    return list(batch.user_text)

  def labels(self, batch) -> list[str]:
    """The gold answers, as remote rewards receive them."""
    return list(batch.gold)

  def decode(self, completion_tokens, completion_mask) -> list[str]:
    tokens, mask = np.asarray(completion_tokens), np.asarray(completion_mask)
    return [self.tokenizer.decode(t[m].tolist(), skip_special_tokens=True)
            for t, m in zip(tokens, mask)]
