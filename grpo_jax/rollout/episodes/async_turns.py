"""Asynchronous turns (env.async_slots = S > 0): an episode is sampled again as soon as its own
environment step returns, not when the slowest tool of the batch does.

The lock-step loop (rollout/episodes/host.py) samples turn k of every live episode in one call, then
waits for every episode's environment step before turn k + 1: one slow tool stalls the batch.
Here each episode moves on its own:

  ready     episodes whose next turn can be sampled (at first, all, in order)
  sample    up to S ready episodes in one call (rollout/slot_continuation.py): each continues
            its own KV cache at its own turn; an episode waiting on a tool holds no slot
  step      each sampled episode's environment step is submitted to the runner's thread pool
            (env.max_concurrency); the loop does not wait for it
  collect   finished steps (their delta appended) make their episodes ready again; the loop
            blocks only when no episode is ready

Which episodes share a call depends on the tools' timing, but nothing an episode gets does:
token t of turn k of episode r is drawn from (key, k, r, t) (the lock-step loop's draws), and
its ids so far are its own. So the episodes are the lock-step loop's with kv_continuation,
id for id wherever the logits agree (they differ only by float rounding, from calls of other
rows): tests/test_async_episodes.py, with tools that sleep at random.
"""

from __future__ import annotations

import concurrent.futures

from grpo_jax.rollout.episodes.state import take_result, take_turn
from grpo_jax.envs.runner import step_result
from grpo_jax.rollout.slot_continuation import SlotTurns


def play_async(sampling, params, env, tokenizer, episodes: list, runner, key, n: int,
               prompt_width: int, row_ids, slots: int) -> int:
  """Plays `episodes` (rollout/episodes/state.Episode, as reset) to their ends with asynchronous
  turns, on `runner`'s thread pool (envs/runner.py); returns the number of sampler calls."""
  turns = SlotTurns(sampling, params, len(episodes), slots, prompt_width, n, row_ids)
  ready, waiting, texts = list(range(len(episodes))), {}, {}

  def collect(finished):
    for future in sorted(finished, key=waiting.get):
      i = waiting.pop(future)
      take_result(episodes[i], texts.pop(i), step_result(future, env, env.step), env,
                  tokenizer, n)
      if not episodes[i].done:
        ready.append(i)

  while ready or waiting:
    collect([f for f in waiting if f.done()])
    if not ready:
      collect(concurrent.futures.wait(
          list(waiting), return_when=concurrent.futures.FIRST_COMPLETED).done)
      continue
    which, ready[:] = ready[:turns.slots], ready[turns.slots:]
    tokens, mask, logprobs = turns(
        which, [episodes[i].prompt + episodes[i].ids for i in which], key,
        [episodes[i].turns for i in which],
        [max(n - len(episodes[i].ids), 1) for i in which])
    for j, i in enumerate(which):
      e = episodes[i]
      text = take_turn(e, tokens[j], mask[j], logprobs[j], sampling.eos_id, n, tokenizer)
      if text is not None:
        texts[i] = text
        waiting[runner.pool.submit(env.step, e.state, text)] = i
  return turns.calls
