"""Episodes per minute with tools that sleep at random: lock-step turns against asynchronous
ones (env.async_slots, grpo_jax/rollout/episodes/async_turns.py), on the tiny calculator config's shapes
(configs/grpo_calculator_tiny.py), random weights.

The environment is benchmarks/kv_continuation.py's (the calculator's problems, a tool message
after every turn, so every episode runs --max_turns turns), its tool sleeping a uniform
[0, --sleep_max) seconds, drawn from the problem and the turn (so every arm meets the same
sleeps). Lock-step turns wait for the slowest tool of each turn; asynchronous ones sample an
episode again as soon as its own tool returns. Each arm plays one compiling batch, then
--repeats batches; the median is reported.

    python benchmarks/async_turns.py [--episodes 64] [--max_turns 4] [--sleep_max 1.0]
                                     [--sleep_law uniform|exponential]

Prints a table and one JSON line.
"""

import argparse
import json
import os
import random
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.kv_continuation import ToolEveryTurn  # noqa: E402
from configs import grpo_calculator_tiny  # noqa: E402
from grpo_jax.data.env_task import EnvTask  # noqa: E402
from grpo_jax.rollout.episodes.host import sample_episodes  # noqa: E402
from grpo_jax.models.config import ModelConfig  # noqa: E402
from grpo_jax.models.decoder import init_params  # noqa: E402
from grpo_jax.rollout.sampler import Sampling  # noqa: E402


class SleepyTool(ToolEveryTurn):
  """ToolEveryTurn whose step sleeps a random time drawn from (a, b, turn): uniform [0,
  sleep_max) or exponential of mean sleep_max / 2 (a long tail: the occasional slow tool)."""

  def __init__(self, calculator, max_turns: int, sleep_max: float, concurrency: int,
               law: str):
    super().__init__(calculator, max_turns)
    self.sleep_max, self.max_concurrency, self.law = sleep_max, concurrency, law

  def step(self, state, turn):
    draw = random.Random(hash((state["a"], state["b"], state["turn"])))
    time.sleep(draw.random() * self.sleep_max if self.law == "uniform"
               else draw.expovariate(2.0 / self.sleep_max))
    return super().step(state, turn)


def _arm(sampling, params, env, task, rows, n: int, how: dict, repeats: int) -> dict:
  def play(seed):
    started = time.perf_counter()
    rollout, infos = sample_episodes(sampling, params, env, task.tokenizer, rows,
                                     list(range(len(rows))), jax.random.key(seed), n,
                                     prompt_width=task.prompt_len, **how)
    return time.perf_counter() - started, rollout, infos
  compile_s = play(0)[0]
  runs = [play(1 + r) for r in range(repeats)]
  seconds = float(np.median([r[0] for r in runs]))
  _, rollout, infos = runs[-1]
  return dict(compile_s=compile_s, seconds=seconds, episodes_per_min=60 * len(rows) / seconds,
              turns=float(np.mean([i["turns"] for i in infos])),
              tokens=np.asarray(rollout.completion_tokens))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--episodes", type=int, default=64)
  parser.add_argument("--max_turns", type=int, default=4)
  parser.add_argument("--max_completion_tokens", type=int, default=200)
  parser.add_argument("--sleep_max", type=float, default=1.0)
  parser.add_argument("--sleep_law", choices=("uniform", "exponential"), default="uniform")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  c = grpo_calculator_tiny.get_config()
  c.env.max_completion_tokens = args.max_completion_tokens
  task = EnvTask.from_config(c, tokenizer=c.task.tokenizer, test_size=c.task.test_size,
                             prompt_width=c.task.prompt_width)
  env = SleepyTool(task.env, args.max_turns, args.sleep_max, args.episodes, args.sleep_law)
  model_cfg = ModelConfig.from_config_dict(c.model)
  params = init_params(model_cfg, jax.random.key(0))
  sampling = Sampling.of(model_cfg, task, c.rollout)
  rows = task.train_rows(0, args.episodes, 0)
  n = task.max_completion_tokens
  arms = {"lockstep_reprefill": {}, "lockstep_continuation": dict(kv_continuation=True),
          f"async_{args.episodes}_slots": dict(async_slots=args.episodes),
          f"async_{args.episodes // 4}_slots": dict(async_slots=max(args.episodes // 4, 1))}
  results = {name: _arm(sampling, params, env, task, rows, n, how, args.repeats)
             for name, how in arms.items()}
  base = results["lockstep_continuation"]
  law = (f"U[0, {args.sleep_max})" if args.sleep_law == "uniform"
         else f"exponential, mean {args.sleep_max / 2}")
  print(f"{args.episodes} episodes, {args.max_turns} turns, tools sleeping {law} s, "
        f"{env.max_concurrency} threads, N={n}")
  print(f"{'arm':<24} {'compile s':>9} {'batch s':>8} {'episodes/min':>12} {'turns':>6} "
        f"{'same ids':>8}")
  for name, r in results.items():
    same = float(np.mean(r["tokens"] == base["tokens"]))
    print(f"{name:<24} {r['compile_s']:>9.2f} {r['seconds']:>8.2f} "
          f"{r['episodes_per_min']:>12.1f} {r['turns']:>6.2f} {same:>8.4f}")
  print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(json.dumps({name: dict(seconds=r["seconds"], episodes_per_min=r["episodes_per_min"],
                               compile_s=r["compile_s"]) for name, r in results.items()}
                   | dict(episodes=args.episodes, max_turns=args.max_turns,
                          sleep_max=args.sleep_max, sleep_law=args.sleep_law, loadavg=list(os.getloadavg()))))


if __name__ == "__main__":
  main()
