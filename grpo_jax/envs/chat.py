"""Token ids in, token ids out: what an environment's messages add to an episode's ids.

An episode's ids are the prompt's (the first messages rendered by the model's chat template,
with the generation prompt), then, turn by turn, the ids the sampler produced for the
assistant (up to and including its end-of-turn token) and the ids of what the environment
answered. Only the environment's part is ever tokenised, once, as the template's delta:

    rendered(before + [assistant] + new, generation prompt)
      = rendered(before, generation prompt) + assistant text + end of turn + DELTA

so the assistant's ids are never rebuilt from text (the re-tokenisation drift verl, TRL and
SkyRL keep fixing). The delta starts after the first end of turn past the earlier messages'
text: a template may render the assistant's text its own way (Llama 3's trims it, so a turn
that ends in a newline renders without it), which the sampled ids keep as sampled. A template
whose rendering of the earlier messages changes when messages are appended (one that drops
old reasoning, say) has no such delta: that raises one sentence (ConfigError).
"""

from __future__ import annotations

from grpo_jax.errors import ConfigError


def render(tokenizer, messages: list, tools=(), add_generation_prompt: bool = False) -> str:
  """The chat template's text of `messages` (tools: the Tools it shows, as `tools=`)."""
  extra = {"tools": [t.schema() for t in tools]} if tools else {}
  return tokenizer.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=add_generation_prompt, **extra)


def environment_delta_ids(tokenizer, before: list, assistant_text: str, new_messages: list,
                          tools=(), end_of_turn: str | None = None) -> list[int]:
  """The ids the environment appends after the assistant's turn: `before` the messages before
  that turn, `assistant_text` the turn's text (decoded from the sampled ids, for the template
  to read), `new_messages` the environment's answer (tool results, the user's reply). The
  delta ends with the generation prompt of the next assistant turn. end_of_turn: the text of
  the token that ended the turn (default: the tokenizer's eos_token)."""
  end = tokenizer.eos_token if end_of_turn is None else end_of_turn
  head = render(tokenizer, before, tools, add_generation_prompt=True)
  after = render(tokenizer, before + [{"role": "assistant", "content": assistant_text}]
                 + new_messages, tools, add_generation_prompt=True)
  turn_end = after.find(end, len(head)) if after.startswith(head) else -1
  if turn_end < 0:
    whole = head + assistant_text + end
    at = next((i for i, (a, b) in enumerate(zip(whole, after)) if a != b), len(after))
    raise ConfigError(f"the chat template renders the episode's earlier turns differently "
                      f"once messages follow them (they differ at character {at}: "
                      f"{whole[at:at + 30]!r} vs {after[at:at + 30]!r}), so the environment's "
                      f"tokens are not a suffix; use a template that keeps earlier turns as "
                      f"they were.")
  return tokenizer.encode(after[turn_end + len(end):], add_special_tokens=False)
