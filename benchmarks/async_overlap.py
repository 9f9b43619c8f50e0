"""Does asynchronous RL's overlap pay? The tiny GRPO recipe scored by a slow remote reward (a
local HTTP server that sleeps 2 s per request, benchmarks/sleeping_reward_server.py, answering
the task's own exact-match reward), at rl.max_staleness 0 (synchronous: the devices idle while
the reward sleeps) and 1 (the next batch is sampled and scored while the update runs), and the
seed-to-seed spread of the synchronous recipe that the learning curves must stay within
(issue 56, must-show 1).

    # steps per minute at staleness 0 and 1 (each step's rows in one 2 s request)
    python benchmarks/async_overlap.py --staleness 0,1 [--steps 40] [--sleep_s 2]
    # the spread: the rule-reward recipe at seeds 0,1,2 in one process (--vmap_seeds)
    python benchmarks/async_overlap.py --staleness "" --seeds 0,1,2
    # both, then whether each staleness run lies within the seeds' spread
    python benchmarks/async_overlap.py --staleness 0,1 --seeds 0,1,2
    # a smoke run on a CPU in a minute or two (6 steps, 20 warm-up steps, 0.2 s sleep)
    python benchmarks/async_overlap.py --tiny --staleness 0
    # extra overrides for every run go after --, e.g. -- --config.rollout.num_prompts=32

Every run is `python -m grpo_jax.main` with configs/grpo_tiny.py shortened (--warmup_steps
supervised steps, --steps RL steps, an evaluation on --eval_size held-out problems every
--eval_every steps); a staleness run uses benchmarks/async_overlap_config.py (the same recipe,
reward.rule_weight=0 and one reward.remote entry: every row of a step in one request, one
request in flight; task "addition_lossless", whose completion texts keep every token, so the
server's rewards are the rule reward's on every row: at staleness 0 the run's metrics are those
of configs/grpo_tiny.py, bit for bit, timings and reward/sleeping_mean aside). Outputs go under
--workdir (default: a new folder in /tmp, kept), each run's output in NAME.log beside it.

Printed: per staleness run, steps per minute over the steps after the first two (compilation and
warm-up excluded: (N - 2) / (elapsed_s[N] - elapsed_s[2]) * 60 from metrics.jsonl), the server's
requests and their mean seconds; the ratio of each staleness k > 0 to 0; a table of reward_mean
(mean over the steps since the previous evaluation) and eval_accuracy at each evaluation step of
every run, and the seeds' min / max of both. Then JSON lines: one per staleness run
{"staleness", "steps_per_min", "reward_mean_last", "eval_accuracy_last", "wall_s"}, one
{"ratio_steps_per_min"} per k > 0 (with "staleness": k), one for the seeds
{"seeds", "steps", "reward_mean_min", "reward_mean_max", "eval_accuracy_min",
"eval_accuracy_max", "wall_s"}, and with both, one {"within_seed_spread"} per staleness run.

The machine must be otherwise idle for the timings to mean anything: other processes on the
same cores slow the update, not the sleeping reward, and so shrink the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
from benchmarks.sleeping_reward_server import running_server  # noqa: E402

SKIP_STEPS = 2  # compilation and warm-up: not timed
# warmup_steps 1000: the recipe's own, from which RL learns visibly in 40 steps (0.3 -> 0.6)
FULL = dict(steps=40, eval_every=10, warmup_steps=1000, eval_size=200, sleep_s=2.0)
TINY = dict(steps=6, eval_every=3, warmup_steps=20, eval_size=50, sleep_s=0.2)


# ----------------------------------------------------------------------------- reading


def read_metrics(path: str) -> list[dict]:
  """metrics.jsonl's records, in step order."""
  with open(path) as f:
    return sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["step"])


def steps_per_minute(records: list[dict], skip: int = SKIP_STEPS) -> float:
  """(N - skip) / (elapsed_s[N] - elapsed_s[skip]) * 60: the steps after the first `skip`
  (compilation, warm-up) per minute of wall time, N the last step."""
  timed = {r["step"]: r["elapsed_s"] for r in records if "elapsed_s" in r}
  last = max(timed)
  if skip not in timed or last <= skip:
    raise ValueError(f"a run of {last} steps has no steps after step {skip} to time; run more "
                     f"steps (--steps).")
  return (last - skip) / (timed[last] - timed[skip]) * 60.0


def at_evaluations(records: list[dict]) -> dict:
  """{eval step: (reward_mean over the steps since the previous evaluation, eval_accuracy)} for
  every evaluation after step 0."""
  out, previous = {}, 0
  for record in records:
    if "eval_accuracy" not in record or record["step"] == 0:
      continue
    step = record["step"]
    window = [r["reward_mean"] for r in records
              if previous < r["step"] <= step and "reward_mean" in r]
    out[step] = (sum(window) / len(window), record["eval_accuracy"])
    previous = step
  return out


def seed_spread(per_seed: dict) -> dict:
  """{eval step: (reward min, reward max, accuracy min, accuracy max)} across seeds, at the steps
  every seed evaluated; per_seed maps a seed to its at_evaluations()."""
  steps = sorted(set.intersection(*(set(e) for e in per_seed.values())))
  spread = {}
  for step in steps:
    rewards = [e[step][0] for e in per_seed.values()]
    accuracies = [e[step][1] for e in per_seed.values()]
    spread[step] = (min(rewards), max(rewards), min(accuracies), max(accuracies))
  return spread


def within_spread(evaluations: dict, spread: dict) -> dict:
  """{eval step: (reward within [min, max], accuracy within [min, max])} at the shared steps."""
  return {step: (lo_r <= evaluations[step][0] <= hi_r, lo_a <= evaluations[step][1] <= hi_a)
          for step, (lo_r, hi_r, lo_a, hi_a) in spread.items() if step in evaluations}


# ----------------------------------------------------------------------------- running


def recipe_flags(settings: dict) -> list[str]:
  """The --config.* flags shortening configs/grpo_tiny.py to `settings`."""
  eval_size = settings["eval_size"]
  return [f"--config.warmup.steps={settings['warmup_steps']}",
          f"--config.train.steps={settings['steps']}",
          f"--config.train.eval_every={settings['eval_every']}",
          f"--config.train.eval_size={eval_size}",
          f"--config.train.eval_batch_size={min(eval_size, 100)}"]


def launch(config: str, workdir: str, flags: list[str]) -> float:
  """Runs grpo_jax.main on `config` into `workdir` (its output in workdir/../NAME.log); the wall
  seconds. A failed run exits this script with its log's last lines."""
  log_path = workdir.rstrip("/") + ".log"
  command = [sys.executable, "-m", "grpo_jax.main", f"--config={config}", f"--workdir={workdir}",
             *flags]
  started = time.perf_counter()
  with open(log_path, "w") as log:
    code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
  wall = time.perf_counter() - started
  if code != 0:
    with open(log_path) as f:
      tail = "".join(f.readlines()[-15:])
    sys.exit(f"{' '.join(command)}\nexited {code}; the end of {log_path}:\n{tail}")
  return wall


def run_staleness(k: int, settings: dict, root: str, extra: list[str]) -> dict:
  """One run at rl.max_staleness=k scored by a fresh sleeping server: its figures."""
  workdir = os.path.join(root, f"staleness_{k}")
  with running_server(settings["sleep_s"]) as server:
    wall = launch(f"benchmarks/async_overlap_config.py:{server.url}", workdir,
                  [*recipe_flags(settings), f"--config.rl.max_staleness={k}", *extra])
    spans = list(server.spans)
  records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  evaluations = at_evaluations(records)
  last = max(evaluations)
  return dict(staleness=k, steps_per_min=steps_per_minute(records),
              reward_mean_last=evaluations[last][0], eval_accuracy_last=evaluations[last][1],
              wall_s=wall, evaluations=evaluations, requests=len(spans),
              request_s=sum(end - start for start, end, _ in spans) / max(len(spans), 1))


def run_seeds(seeds: list[int], settings: dict, root: str, extra: list[str]) -> dict:
  """The rule-reward recipe at `seeds` in one process (--vmap_seeds): its spread."""
  workdir = os.path.join(root, "seeds")
  wall = launch("configs/grpo_tiny.py", workdir,
                [*recipe_flags(settings), f"--vmap_seeds={','.join(map(str, seeds))}", *extra])
  per_seed = {s: at_evaluations(read_metrics(os.path.join(workdir, f"seed_{s}",
                                                          "metrics.jsonl"))) for s in seeds}
  return dict(seeds=seeds, wall_s=wall, per_seed=per_seed, spread=seed_spread(per_seed))


# ----------------------------------------------------------------------------- printing


def print_report(runs: list[dict], seeds: dict | None) -> None:
  for run in runs:
    print(f"staleness {run['staleness']}: {run['steps_per_min']:.1f} steps/min after step "
          f"{SKIP_STEPS}, {run['wall_s']:.0f} s in all; {run['requests']} reward requests of "
          f"{run['request_s']:.2f} s on average")
  base = next((r for r in runs if r["staleness"] == 0), None)
  ratios = [(r["staleness"], r["steps_per_min"] / base["steps_per_min"]) for r in runs
            if base and r["staleness"] != 0]
  for k, ratio in ratios:
    print(f"staleness {k} / staleness 0: {ratio:.2f}x steps per minute")
  steps = sorted(set().union(*(r["evaluations"] for r in runs),
                             seeds["spread"] if seeds else ()))
  header = [f"k={r['staleness']} reward | k={r['staleness']} acc" for r in runs]
  if seeds:
    header += ["seeds reward min-max | seeds acc min-max"]
  print("| step | " + " | ".join(header) + " |")
  print("|---" * (1 + 2 * len(runs) + (2 if seeds else 0)) + "|")
  for step in steps:
    cells = []
    for run in runs:
      reward, accuracy = run["evaluations"].get(step, (float("nan"),) * 2)
      cells += [f"{reward:.3f}", f"{accuracy:.3f}"]
    if seeds:
      lo_r, hi_r, lo_a, hi_a = seeds["spread"].get(step, (float("nan"),) * 4)
      cells += [f"{lo_r:.3f}-{hi_r:.3f}", f"{lo_a:.3f}-{hi_a:.3f}"]
    print(f"| {step} | " + " | ".join(cells) + " |")
  for run in runs:
    print(json.dumps({k: run[k] for k in ("staleness", "steps_per_min", "reward_mean_last",
                                          "eval_accuracy_last", "wall_s")}))
  for k, ratio in ratios:
    print(json.dumps({"ratio_steps_per_min": ratio, "staleness": k}))
  if seeds:
    spread = seeds["spread"]
    columns = list(zip(*spread.values())) or [()] * 4
    print(json.dumps({"seeds": seeds["seeds"], "steps": list(spread),
                      "reward_mean_min": list(columns[0]), "reward_mean_max": list(columns[1]),
                      "eval_accuracy_min": list(columns[2]),
                      "eval_accuracy_max": list(columns[3]), "wall_s": seeds["wall_s"]}))
    for run in runs:
      inside = within_spread(run["evaluations"], spread)
      print(json.dumps({"within_seed_spread": all(all(v) for v in inside.values()),
                        "staleness": run["staleness"],
                        "steps": {str(s): {"reward": r, "accuracy": a}
                                  for s, (r, a) in inside.items()}}))


def integers(text: str) -> list[int]:
  return [int(part) for part in text.split(",") if part.strip()]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--staleness", type=integers, default=[0, 1],
                      help="rl.max_staleness values to run with the sleeping server, e.g. 0,1; "
                           "'' = none")
  parser.add_argument("--seeds", type=integers, default=[],
                      help="seeds of the rule-reward recipe for the spread (--vmap_seeds), e.g. "
                           "0,1,2; '' (default) = none")
  parser.add_argument("--tiny", action="store_true",
                      help=f"a smoke run: {TINY} unless given below")
  for name, value in FULL.items():
    parser.add_argument(f"--{name}", type=type(value), default=None,
                        help=f"default {value} ({TINY[name]} with --tiny)")
  parser.add_argument("--workdir", default="", help="default: a new folder in /tmp")
  parser.add_argument("extra", nargs="*", help="more --config.* flags for every run, after --")
  args = parser.parse_args()
  settings = {name: (getattr(args, name) if getattr(args, name) is not None else
                     (TINY if args.tiny else FULL)[name]) for name in FULL}
  if settings["steps"] <= SKIP_STEPS:
    parser.error(f"--steps={settings['steps']} leaves no timed step; use more than {SKIP_STEPS}.")
  root = args.workdir or tempfile.mkdtemp(prefix="async_overlap_")
  os.makedirs(root, exist_ok=True)
  print(f"configs/grpo_tiny.py, {settings}; outputs in {root}", flush=True)
  runs = [run_staleness(k, settings, root, args.extra) for k in args.staleness]
  seeds = run_seeds(args.seeds, settings, root, args.extra) if args.seeds else None
  print_report(runs, seeds)


if __name__ == "__main__":
  main()
