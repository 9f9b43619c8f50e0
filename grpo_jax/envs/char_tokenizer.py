"""A character-level chat tokenizer (task.tokenizer="char"): one id per printable ASCII
character and newline, ChatML's three special tokens, and a ChatML chat template that shows
the offered tools in one short system line. For environments trained from random weights on a
CPU (configs/grpo_calculator_tiny.py), where short sequences and a small vocabulary matter more
than compression. A transformers `PreTrainedTokenizerFast`, so the episode code treats it as
any Hugging Face tokenizer (its chat template takes `tools=`)."""

from __future__ import annotations

import functools
import string

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML: <|im_start|>role\ncontent<|im_end|>\n per message; with tools, a first system line
# naming them; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system{{ '\\n' }}tools: "
    "{% for t in tools %}{{ t.function.name if t.function is defined else t.name }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content }}<|im_end|>"
    "{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}")


@functools.lru_cache(maxsize=1)
def char_chat_tokenizer():
  """The tokenizer (built in memory, the same ids on every machine: specials 0-2, then "\\n"
  and the printable ASCII characters in order)."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415
  from transformers import PreTrainedTokenizerFast  # noqa: PLC0415
  chars = "\n" + "".join(c for c in string.printable if c.isprintable())
  vocab = {t: i for i, t in enumerate(SPECIALS + tuple(chars))}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tok.decoder = decoders.Fuse()
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", bos_token=None)
  fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
  fast.chat_template = CHAT_TEMPLATE
  return fast
