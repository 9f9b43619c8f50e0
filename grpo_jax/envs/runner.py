"""Stepping a batch of episodes at once (env.max_concurrency threads), so that one slow tool
never stalls the others; results come back in the episodes' order, whatever finished first,
so an episode's course never depends on the timing of the others."""

from __future__ import annotations

import concurrent.futures

from grpo_jax.errors import RunStopped


def step_result(future, env, fn):
  """The call's result; a sys.exit() or KeyboardInterrupt inside the environment's own code
  becomes one sentence that stops the run (exit 1), never a silent success (exit 0)."""
  try:
    return future.result()
  except BaseException as e:  # noqa: BLE001
    if isinstance(e, Exception) or not (future.done() and future.exception() is e):
      raise
    what = (f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else
            f"raised {type(e).__name__}")
    raise RunStopped(f"the environment {type(env).__name__}'s {fn.__name__} {what}; fix it: "
                     f"an environment returns its result and never ends the process.") from None


class EpisodeRunner:
  """env.step over many episodes on a thread pool of env.max_concurrency workers (1: one after
  the other, in order). Use as a context manager, or call close()."""

  def __init__(self, env):
    self.env = env
    self.pool = concurrent.futures.ThreadPoolExecutor(max(int(env.max_concurrency), 1),
                                                      thread_name_prefix="episode")

  def reset(self, rows: list, seeds: list) -> list:
    """[(state, messages)] of env.reset(row, seed) for each episode."""
    return self._all(self.env.reset, rows, seeds)

  def step(self, states: list, turns: list) -> list:
    """[StepResult] of env.step(state, turn) for each episode."""
    return self._all(self.env.step, states, turns)

  def _all(self, fn, firsts, seconds) -> list:
    futures = [self.pool.submit(fn, a, b) for a, b in zip(firsts, seconds)]
    return [step_result(f, self.env, fn) for f in futures]

  def close(self):
    self.pool.shutdown(wait=True, cancel_futures=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
