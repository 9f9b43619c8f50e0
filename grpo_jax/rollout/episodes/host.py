"""Sampling multi-turn episodes as token ids. Each turn either prefills the episode so far
again (the default) or, with kv_continuation (env.kv_continuation), continues each row's KV
cache with only its new ids (rollout/continuation.py): the same draws, so the same tokens up to
float rounding of the logits.

`sample_episodes` plays B episodes of an environment with a jitted sampler, turn by turn:

  ids = prompt ids (the first messages, the template's generation prompt)
      + turn 1: the sampler's ids (through its end-of-turn token), the policy's actions
      + the environment's answer: the template's delta (envs/chat.py), tokenised once
      + turn 2: the sampler's ids ...

and returns them as one `Rollout`: prompt (B, P) left-padded, completion (B, N) the rest,
`action_mask` True on the sampler's ids only (the loss, the KL and the advantage are the
policy's), `logprobs` the sampler's (0 on environment tokens). An episode ends when the
environment says done, after env.max_turns turns, or when its N completion ids are spent
(truncated: reward 0). A turn that reaches the sampler's max_new_tokens without its end-of-turn
token is closed by one (an environment token, not the policy's action).

Determinism: every turn's sampler call holds all B episodes at their fixed rows (an ended one
decodes a single ignored token), with the key fold_in(key, turn), so token t of turn k of
episode r is drawn from (key, turn, r, t) alone, whatever the tools' timing or the order the
environment's steps finish in (envs/runner.py returns them in order). r is the episode's row,
or its id (`episode_ids`), which makes its tokens independent of the batch it shares.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np

from grpo_jax.rollout.episodes.async_turns import play_async
from grpo_jax.envs.chat import render
from grpo_jax.errors import ConfigError
from grpo_jax.rollout.episodes.state import Episode, take_result, take_turn
from grpo_jax.envs.runner import EpisodeRunner
from grpo_jax.rollout.slot_continuation import SlotTurns
from grpo_jax.rollout.types import Rollout


def _left_pad(rows: list, width: int, pad_id: int):
  tokens = np.full((len(rows), width), pad_id, np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):] = r
    mask[i, width - len(r):] = True
  return tokens, mask


def _bucket(n: int, step: int) -> int:
  return -(-n // step) * step


def _reprefilled_turns(sampling, params, row_ids, width_bucket: int):
  """A turn's sampler call on the episodes so far, left-padded to a multiple of width_bucket
  and prefilled whole: (sequences, key, turn, limits, live) -> (tokens, mask, logprobs)
  (B, M), drawn with fold_in(key, turn)."""
  def sample(sequences, key, turn, limits, live):
    del live  # (an ended episode decodes one ignored token: limit 1)
    width = _bucket(max(map(len, sequences)), width_bucket)
    tokens, mask = _left_pad(sequences, width, sampling.pad_id)
    out = jax.device_get(sampling.with_stats(params, tokens, mask, jax.random.fold_in(key, turn),
                                             limits, row_ids)[0])
    return out.completion_tokens, out.completion_mask, out.logprobs
  return sample


def _continued_turns(sampling, params, rows: int, prompt_width: int, n: int, row_ids):
  """The same call continuing the live rows' KV caches with their new ids
  (rollout/slot_continuation.SlotTurns with a slot per row); an ended row's outputs are 0."""
  turns = SlotTurns(sampling, params, rows, rows, prompt_width, n, row_ids)

  def sample(sequences, key, turn, limits, live):
    which = np.flatnonzero(live).tolist()
    got = turns(which, [sequences[i] for i in which], key, [turn] * len(which),
                np.asarray(limits)[which].tolist())
    out = [np.zeros((rows, *g.shape[1:]), g.dtype) for g in got]
    for o, g in zip(out, got):
      o[which] = g
    return out
  return sample


def sample_episodes(sampling, params, env, tokenizer, rows: list, seeds: list, key,
                    max_completion_tokens: int, width_bucket: int = 32,
                    prompt_width: int | None = None, episode_ids=None,
                    kv_continuation: bool = False, async_slots: int = 0):
  """(Rollout of the B = len(rows) episodes, [per-episode dict(reward, turns, truncated,
  state)]). sampling: the turn's `Sampling` (group_size 1; its max_new_tokens caps one turn);
  max_completion_tokens: N, every id after the prompt (the sampler's and the environment's);
  prompt_width: the Rollout's prompt width (None: the longest prompt's), fixed by a training
  source so that every step's update has one shape (a longer prompt: ConfigError, before any
  turn is sampled). episode_ids: each episode's id r in its draws (None: its row); with ids,
  token t of turn k of episode r is drawn from (key, k, r, t) alone, whichever episodes share
  the batch and in which order. kv_continuation: each turn continues the rows' KV caches with
  their new ids (rollout/continuation.py) instead of prefilling the episodes so far again.
  async_slots: S > 0 plays asynchronous turns (rollout/episodes/async_turns.py; continues the
  KV caches): an episode is sampled as soon as its own environment step returns, up to S
  episodes a call."""
  row_ids = None if episode_ids is None else np.asarray(episode_ids, np.int32)
  with EpisodeRunner(env) as runner:
    episodes = []
    for state, messages in runner.reset(rows, seeds):
      prompt = tokenizer.encode(render(tokenizer, messages, env.tools,
                                       add_generation_prompt=True), add_special_tokens=False)
      episodes.append(Episode(state, list(messages), prompt))
    longest = max(len(e.prompt) for e in episodes)
    if prompt_width and longest > prompt_width:
      raise ConfigError(f"an episode's first messages take {longest} tokens, more than "
                        f"task.prompt_width={prompt_width}; raise it.")
    cache_width = max(prompt_width or 0, _bucket(longest, width_bucket))  # a KV cache's prompt
    if async_slots:
      play_async(sampling, params, env, tokenizer, episodes, runner, key, max_completion_tokens,
                 cache_width, row_ids, async_slots)
      return _finish(episodes, env, max_completion_tokens, sampling.pad_id, prompt_width)
    sample_turn = (_continued_turns(sampling, params, len(episodes), cache_width,
                                    max_completion_tokens, row_ids)
                   if kv_continuation else
                   _reprefilled_turns(sampling, params, row_ids, width_bucket))
    for turn in range(env.max_turns):
      live = [e for e in episodes if not e.done]
      if not live:
        break
      limits = np.array([1 if e.done else max(max_completion_tokens - len(e.ids), 1)
                         for e in episodes], np.int32)
      tokens, mask, logprobs = sample_turn([e.prompt + e.ids for e in episodes], key, turn,
                                           limits, [not e.done for e in episodes])
      texts = [take_turn(e, tokens[i], mask[i], logprobs[i], sampling.eos_id,
                         max_completion_tokens, tokenizer) for i, e in enumerate(episodes)
               if not e.done]
      stepping = [(e, t) for e, t in zip(live, texts) if t is not None]
      for (e, text), result in zip(stepping, runner.step([e.state for e, _ in stepping],
                                                         [t for _, t in stepping])):
        take_result(e, text, result, env, tokenizer, max_completion_tokens)
  return _finish(episodes, env, max_completion_tokens, sampling.pad_id, prompt_width)


def _finish(episodes: list, env, n: int, pad_id: int, prompt_width: int | None):
  """(Rollout, [per-episode dict(reward, turns, truncated, state)]); the environment's optional
  end_episode(state) once per episode, whatever ended it (done, env.max_turns, the budget)."""
  end = getattr(env, "end_episode", None)
  for e in episodes if end is not None else ():
    end(e.state)
  width = prompt_width or max(len(e.prompt) for e in episodes)
  prompt_tokens, prompt_mask = _left_pad([e.prompt for e in episodes], width, pad_id)
  b = len(episodes)
  tokens = np.full((b, n), pad_id, np.int32)
  mask, actions = np.zeros((b, n), bool), np.zeros((b, n), bool)
  logprobs = np.zeros((b, n), np.float32)
  for i, e in enumerate(episodes):
    k = len(e.ids)
    tokens[i, :k], mask[i, :k], actions[i, :k], logprobs[i, :k] = (e.ids, True, e.actions,
                                                                   e.logprobs)
  truncated = np.array([e.truncated for e in episodes])
  return Rollout(prompt_tokens, prompt_mask, tokens, mask, logprobs, truncated, actions), [
      dict(reward=e.reward, turns=e.turns, truncated=e.truncated, state=e.state)
      for e in episodes]


def episode_metrics(rollout: Rollout, infos: list, prefix: str = "") -> dict:
  """Means over a batch of episodes: turns, tool calls and their errors by kind (from the
  environment's state, when it counts tool_calls / tool_errors / tool_seconds), tool latency,
  and the share of the episodes' completion ids that are the environment's (not trained)."""
  states = [i["state"] if isinstance(i["state"], dict) else {} for i in infos]
  calls = sum(s.get("tool_calls", 0) for s in states)
  kinds = {}
  for s in states:
    for kind, n in s.get("tool_errors", {}).items():
      kinds[kind] = kinds.get(kind, 0) + n
  mask = np.asarray(rollout.completion_mask, bool)
  actions = np.asarray(rollout.action_mask, bool) & mask
  out = dict(turns_per_episode=float(np.mean([i["turns"] for i in infos])),
             tool_calls_per_episode=calls / len(infos),
             tool_error_rate=sum(kinds.values()) / max(calls, 1),
             tool_latency_s=sum(s.get("tool_seconds", 0.0) for s in states) / max(calls, 1),
             env_token_fraction=float(1.0 - actions.sum() / max(mask.sum(), 1)))
  out.update({f"tool_errors/{k}": n / max(calls, 1) for k, n in sorted(kinds.items())})
  return {prefix + k: v for k, v in out.items()}


def episode_samples(tokenizer, prompts: list, rollout: Rollout, rewards, split: str, step: int,
                    rows) -> list[dict]:
  """Sample records of whole episodes (rows of `rollout`): the prompt text, the completion
  ids decoded as they are, and `turns`, the completion cut where the trained ids (the policy's
  actions) and the environment's alternate: [{"trained": bool, "text": ...}, ...]."""
  out = []
  for r in rows:
    mask = np.asarray(rollout.completion_mask[r], bool)
    ids = np.asarray(rollout.completion_tokens[r])[mask].tolist()
    trained = np.asarray(rollout.action_mask[r], bool)[mask].tolist()
    turns = [dict(trained=bool(t), text=tokenizer.decode([i for i, _ in run],
                                                         skip_special_tokens=False))
             for t, run in itertools.groupby(zip(ids, trained), key=lambda pair: pair[1])]
    reward = float(rewards[r])
    out.append(dict(step=int(step), split=split, prompt=prompts[r],
                    completion=tokenizer.decode(ids, skip_special_tokens=False), reward=reward,
                    correct=float(reward >= 1.0), turns=turns))
  return out
