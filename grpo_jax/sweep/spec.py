"""A sweep file and the runs it names.

A sweep file is a Python file with `get_sweep()` returning a dict:

    base_config   path of the config file every run starts from (relative to the repository)
    overrides     {"train.steps": 200, ...}: applied to every run
    grid          {"rl.advantage": ["grpo", "rloo"], ...}: every combination is one arm
    arm_overrides {"rl.advantage=gae": {"rl.value_head": "shared"}}: extra overrides for the
                  arms whose name contains the key (optional)
    seeds         [0, 1, 2]
    seed_axis     "vmap" or "map": the seeds of an arm run as one program
                  (grpo_jax/train/seeds.py); "none": one process per seed (default)
    recipes       {"dpo": {"config": "configs/dpo_tiny.py", "program": "grpo_jax.train_dpo"}}:
                  named starting points, chosen per arm by the grid key "recipe" (optional):
                  an arm with a recipe starts from its config file and runs its program
                  (default grpo_jax.main) instead of base_config's; so that GRPO, online DPO
                  and the DPO stage's runs share one sweep, one table and one plot

Runs live in WORKDIR/<arm>/seed_<s>/ whichever way they ran; an arm is named by its grid
values, e.g. "advantage=rloo" (the last part of each key, or the whole key where that is
ambiguous).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import runpy

SEED_AXES = ("none", "vmap", "map")


class SweepError(ValueError):
  """A sweep file that cannot be run; the message names the value and the fix."""


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  values: dict  # grid key -> value
  overrides: dict  # every override of this arm (common ones, grid values, arm extras)
  config: str = ""  # its config file ("" = the sweep's base_config)
  program: str = "grpo_jax.main"  # the module its processes run


@dataclasses.dataclass(frozen=True)
class Sweep:
  name: str
  base_config: str
  arms: tuple
  seeds: tuple
  seed_axis: str
  grid_keys: tuple


def _format(value) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def _arm_names(grid_keys, combos) -> list[str]:
  short = [k.split(".")[-1] for k in grid_keys]
  keys = short if len(set(short)) == len(short) else list(grid_keys)
  return [",".join(f"{k}={_format(v)}" for k, v in zip(keys, combo)) or "base"
          for combo in combos]


def load_sweep(path: str) -> Sweep:
  """Reads and checks a sweep file."""
  if not os.path.isfile(path):
    raise SweepError(f"--sweep={path} is not a file; pass a sweep file such as "
                     f"configs/sweeps/estimators_tiny.py.")
  module = runpy.run_path(path)
  if "get_sweep" not in module:
    raise SweepError(f"{path} has no get_sweep() function; define one returning a dict "
                     f"(see grpo_jax/sweep/spec.py).")
  raw = dict(module["get_sweep"]())
  known = {"base_config", "overrides", "grid", "arm_overrides", "seeds", "seed_axis", "recipes"}
  unknown = sorted(set(raw) - known)
  if unknown:
    raise SweepError(f"{path}: unknown sweep field(s) {unknown}; valid: {sorted(known)}.")
  if "base_config" not in raw:
    raise SweepError(f"{path}: get_sweep() must name base_config, e.g. "
                     f"'configs/grpo_tiny.py'.")
  seeds = tuple(int(s) for s in raw.get("seeds", [0]))
  if not seeds or len(set(seeds)) != len(seeds):
    raise SweepError(f"{path}: seeds={list(seeds)}; give distinct integers, e.g. [0, 1, 2].")
  seed_axis = raw.get("seed_axis", "none")
  if seed_axis not in SEED_AXES:
    raise SweepError(f"{path}: seed_axis={seed_axis!r} is unknown; valid: {SEED_AXES}.")
  grid = dict(raw.get("grid", {}))
  for key, values in grid.items():
    if not isinstance(values, (list, tuple)) or not values:
      raise SweepError(f"{path}: grid[{key!r}]={values!r}; give a non-empty list of values.")
  common = dict(raw.get("overrides", {}))
  extras = dict(raw.get("arm_overrides", {}))
  recipes = dict(raw.get("recipes", {}))
  for recipe in grid.get("recipe", ()):
    if recipe not in recipes or "config" not in recipes[recipe]:
      raise SweepError(f"{path}: grid['recipe'] names {recipe!r}, which recipes does not define "
                       f"with a config; add recipes={{{recipe!r}: {{'config': ..., 'program': "
                       f"...}}}}.")
  combos = list(itertools.product(*grid.values()))
  arms = []
  for name, combo in zip(_arm_names(tuple(grid), combos), combos):
    values = dict(zip(grid, combo))
    recipe = recipes.get(values.get("recipe"), {})
    overrides = {**common, **{k: v for k, v in values.items() if k != "recipe"}}
    for pattern, extra in extras.items():
      if pattern in name:
        overrides.update(extra)
    program = recipe.get("program", "grpo_jax.main")
    if program != "grpo_jax.main" and seed_axis != "none":
      raise SweepError(f"{path}: recipe {values['recipe']!r} runs {program}, which takes one seed "
                       f"per process; set seed_axis='none'.")
    arms.append(Arm(name, values, overrides, recipe.get("config", ""), program))
  stem = os.path.splitext(os.path.basename(path))[0]
  return Sweep(stem, raw["base_config"], tuple(arms), seeds, seed_axis, tuple(grid))


@dataclasses.dataclass(frozen=True)
class Job:
  """One process: an arm's seeds (all of them in one program with a seed axis, else one)."""
  arm: Arm
  seeds: tuple
  workdir: str  # the --workdir of the process
  command: tuple  # starts with "python" (the runner uses its own interpreter)

  def seed_dirs(self, sweep_dir: str) -> list[str]:
    return [run_dir(sweep_dir, self.arm, s) for s in self.seeds]


def run_dir(sweep_dir: str, arm: Arm, seed: int) -> str:
  return os.path.join(sweep_dir, arm.name, f"seed_{seed}")


def jobs(sweep: Sweep, sweep_dir: str, seeds_to_run: dict) -> list[Job]:
  """The processes that run `seeds_to_run[arm.name]` (a subset of the sweep's seeds)."""
  out = []
  for arm in sweep.arms:
    seeds = tuple(seeds_to_run.get(arm.name, ()))
    if not seeds:
      continue
    flags = [f"--config.{k}={_format(v)}" for k, v in arm.overrides.items()]
    base = ["python", "-m", arm.program, f"--config={arm.config or sweep.base_config}"]
    if sweep.seed_axis == "none":
      for s in seeds:
        workdir = run_dir(sweep_dir, arm, s)
        out.append(Job(arm, (s,), workdir, tuple(
            base + [f"--workdir={workdir}", f"--config.seed={s}"] + flags)))
    else:
      workdir = os.path.join(sweep_dir, arm.name)
      out.append(Job(arm, seeds, workdir, tuple(
          base + [f"--workdir={workdir}", f"--vmap_seeds={','.join(map(str, seeds))}",
                  f"--seed_axis={sweep.seed_axis}"] + flags)))
  return out
