"""Episode rollout time with and without KV-cache continuation (env.kv_continuation,
grpo_jax/rollout/continuation.py) on the tiny calculator config (configs/grpo_calculator_tiny.py:
its model shape, character tokenizer, prompt width, turn cap and batch of num_prompts x
group_size episodes), random weights.

A random policy neither calls the calculator nor answers, so the calculator would end every
episode after one turn. The benchmark's environment is the calculator's problems with a tool
message (the product) after every turn, so each episode runs env.max_turns turns (or until its
budget of ids): what continuation saves is the re-prefill of the episode so far at each turn.
Each arm is played once to compile, then --repeats times at other keys; the median is reported.

    python benchmarks/kv_continuation.py [--max_turns 2] [--max_completion_tokens 80]
                                         [--repeats 3]

Prints the two timings, their ratio and one JSON line.
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import grpo_calculator_tiny  # noqa: E402
from grpo_jax.data.env_task import EnvTask  # noqa: E402
from grpo_jax.envs import StepResult  # noqa: E402
from grpo_jax.rollout.episodes.host import sample_episodes  # noqa: E402
from grpo_jax.models.config import ModelConfig  # noqa: E402
from grpo_jax.models.decoder import init_params  # noqa: E402
from grpo_jax.rollout.sampler import Sampling  # noqa: E402


class ToolEveryTurn:
  """The calculator's problems, a tool message with the product after every turn, ended by
  max_turns."""

  def __init__(self, calculator, max_turns: int):
    self.calculator, self.max_turns = calculator, max_turns
    self.tools, self.max_concurrency = calculator.tools, calculator.max_concurrency

  def reset(self, row, seed):
    return self.calculator.reset(row, seed)

  def step(self, state, turn):
    state = dict(state, turn=state["turn"] + 1)
    done = state["turn"] >= self.max_turns
    message = {"role": "tool", "name": "calculator", "content": str(state["a"] * state["b"])}
    return StepResult(state, [message], 0.0 if done else None, done)


def _arm(sampling, params, env, task, rows, n: int, continued: bool, repeats: int) -> dict:
  """Median seconds of one batch of episodes (after one compiling call), and their mean
  turns and ids."""
  def play(seed):
    started = time.perf_counter()
    rollout, infos = sample_episodes(sampling, params, env, task.tokenizer, rows,
                                     list(range(len(rows))), jax.random.key(seed), n,
                                     prompt_width=task.prompt_len, kv_continuation=continued)
    return time.perf_counter() - started, rollout, infos
  compile_s, _, _ = play(0)
  runs = [play(1 + r) for r in range(repeats)]
  _, rollout, infos = runs[-1]
  return dict(compile_s=compile_s, seconds=float(np.median([r[0] for r in runs])),
              turns=float(np.mean([i["turns"] for i in infos])),
              ids=float(np.asarray(rollout.completion_mask).sum(1).mean()),
              tokens=np.asarray(rollout.completion_tokens), logprobs=np.asarray(
                  rollout.logprobs))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--max_turns", type=int, default=0, help="0: the config's env.max_turns")
  parser.add_argument("--max_completion_tokens", type=int, default=0,
                      help="0: the config's env.max_completion_tokens")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  c = grpo_calculator_tiny.get_config()
  if args.max_completion_tokens:
    c.env.max_completion_tokens = args.max_completion_tokens
  task = EnvTask.from_config(c, tokenizer=c.task.tokenizer, test_size=c.task.test_size,
                             prompt_width=c.task.prompt_width)
  env = ToolEveryTurn(task.env, args.max_turns or c.env.max_turns)
  model_cfg = ModelConfig.from_config_dict(c.model)
  params = init_params(model_cfg, jax.random.key(0))
  sampling = Sampling.of(model_cfg, task, c.rollout)
  batch = c.rollout.num_prompts * c.rollout.group_size
  rows = task.train_rows(0, batch, 0)
  n = task.max_completion_tokens
  arms = {name: _arm(sampling, params, env, task, rows, n, continued, args.repeats)
          for name, continued in (("reprefill", False), ("continuation", True))}
  same = float(np.mean(arms["reprefill"]["tokens"] == arms["continuation"]["tokens"]))
  gap = float(np.max(np.abs(arms["reprefill"]["logprobs"] - arms["continuation"]["logprobs"])))
  print(f"{batch} episodes, max_turns={env.max_turns}, N={n}, turn cap "
        f"{sampling.max_new_tokens}, temperature {sampling.temperature}")
  print(f"{'arm':<13} {'compile s':>9} {'rollout s':>9} {'turns':>6} {'ids':>6}")
  for name, r in arms.items():
    print(f"{name:<13} {r['compile_s']:>9.2f} {r['seconds']:>9.3f} {r['turns']:>6.2f} "
          f"{r['ids']:>6.1f}")
  ratio = arms["reprefill"]["seconds"] / arms["continuation"]["seconds"]
  print(f"speedup (reprefill / continuation): {ratio:.2f}x; same ids: {same:.4f}; "
        f"max |logprob gap|: {gap:.2e}")
  print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(json.dumps(dict(reprefill_s=arms["reprefill"]["seconds"],
                        continuation_s=arms["continuation"]["seconds"], speedup=ratio,
                        reprefill_compile_s=arms["reprefill"]["compile_s"],
                        continuation_compile_s=arms["continuation"]["compile_s"],
                        episodes=batch, max_turns=env.max_turns, max_completion_tokens=n,
                        turns_per_episode=arms["continuation"]["turns"],
                        same_ids_fraction=same, max_logprob_gap=gap,
                        loadavg=list(os.getloadavg()))))


if __name__ == "__main__":
  main()
