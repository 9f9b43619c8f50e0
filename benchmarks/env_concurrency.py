"""Episodes per minute of the calculator environment (grpo_jax/envs/) when its tool sleeps
0-1 s at random (0.5 s on average): the episodes stepped concurrently (env.max_concurrency
threads, envs/runner.py) against one after the other, at 16 episodes of two turns (a tool
call, then the answer). Prints one JSON line.

    python benchmarks/env_concurrency.py [--episodes 16]
"""

import argparse
import dataclasses
import json
import random
import time
import zlib

from grpo_jax.envs.builtin_tools import CALCULATOR
from grpo_jax.envs.calculator import CalculatorEnv, calculator_rows
from grpo_jax.envs.runner import EpisodeRunner


class SleepyCalculator(CalculatorEnv):
  def __init__(self, max_concurrency, seed):
    super().__init__(max_concurrency=max_concurrency)
    rng = random.Random(seed)
    delays = [rng.random() for _ in range(1024)]

    def sleepy(expression):
      time.sleep(delays[zlib.crc32(expression.encode()) % len(delays)])
      return CALCULATOR.function(expression)
    self._by_name = {"calculator": dataclasses.replace(CALCULATOR, function=sleepy,
                                                       timeout_s=5.0)}


def episodes_per_minute(concurrency: int, episodes: int) -> float:
  rows = calculator_rows(episodes, 4, seed=0)
  calls = [f'<tool_call>{{"name": "calculator", "arguments": {{"expression": '
           f'"{r["a"]} * {r["b"]}"}}}}</tool_call>' for r in rows]
  answers = [f"Answer: {r['a'] * r['b']}" for r in rows]
  with EpisodeRunner(SleepyCalculator(concurrency, 0)) as runner:
    started = time.perf_counter()
    states = [s for s, _ in runner.reset(rows, list(range(episodes)))]
    states = [r.state for r in runner.step(states, calls)]
    rewards = [r.reward for r in runner.step(states, answers)]
    seconds = time.perf_counter() - started
  assert rewards == [1.0] * episodes
  return episodes / seconds * 60


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--episodes", type=int, default=16)
  episodes = parser.parse_args().episodes
  concurrent = episodes_per_minute(episodes, episodes)
  sequential = episodes_per_minute(1, episodes)
  print(json.dumps({"episodes": episodes, "concurrent_episodes_per_min": round(concurrent, 1),
                    "sequential_episodes_per_min": round(sequential, 1),
                    "speedup": round(concurrent / sequential, 2)}))


if __name__ == "__main__":
  main()
