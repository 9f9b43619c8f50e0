"""One episode as the host loops build it (rollout/episodes/host.py lock-step, rollout/episodes/async_turns.py
asynchronous): its ids after the prompt, which are the policy's, their log-probs, and what
one sampled turn and one environment step append. Both loops call the same two functions, so
they build the same episodes."""

from __future__ import annotations

import dataclasses

from grpo_jax.envs import check_step_result
from grpo_jax.envs.chat import environment_delta_ids


@dataclasses.dataclass
class Episode:
  state: object
  messages: list  # the chat so far, as the template reads it
  prompt: list  # ids
  ids: list = dataclasses.field(default_factory=list)  # completion ids after the prompt
  actions: list = dataclasses.field(default_factory=list)  # bool per id: the policy's
  logprobs: list = dataclasses.field(default_factory=list)
  reward: float = 0.0
  done: bool = False
  truncated: bool = False
  turns: int = 0

  def extend(self, ids: list, logprobs=None):  # the policy's ids (with log-probs), or not
    self.ids += ids
    self.actions += [logprobs is not None] * len(ids)
    self.logprobs += [0.0] * len(ids) if logprobs is None else logprobs


def take_turn(e: Episode, tokens, mask, logprobs, eos_id: int, n: int, tokenizer):
  """Appends one sampled turn (row arrays (M,)) to episode e and returns its text for the
  environment (without its end-of-turn id), or None when the turn spent the episode's n ids
  without ending (e is then done, truncated). A turn cut by the sampler's cap is closed by an
  end-of-turn id that is the environment's, not the policy's."""
  count = int(mask.sum())
  sampled = tokens[:count].tolist()
  e.extend(sampled, logprobs[:count].tolist())
  e.turns += 1
  ended = count and sampled[-1] == eos_id
  text = tokenizer.decode(sampled[:-1] if ended else sampled, skip_special_tokens=False)
  if not ended and len(e.ids) < n:
    e.extend([eos_id])
  elif not ended:
    e.done, e.truncated = True, True
    return None
  return text


def take_result(e: Episode, text: str, result, env, tokenizer, n: int) -> None:
  """Applies the environment's step on e's last turn: done (or its env.max_turns-th turn) ends
  the episode with the step's reward; else the template's delta of the new messages is
  appended (not trained), cut at the episode's n ids (no room: done, truncated)."""
  result = check_step_result(result, env)
  e.state = result.state
  if result.done or e.turns == env.max_turns:
    e.done, e.reward = True, float(result.reward or 0.0)
    return
  delta = environment_delta_ids(tokenizer, e.messages, text, result.messages, env.tools,
                                tokenizer.eos_token)
  e.messages = e.messages + [{"role": "assistant", "content": text}] + result.messages
  room = n - len(e.ids)
  e.extend(delta[:room])
  if len(delta) >= room:
    e.done, e.truncated = True, True
