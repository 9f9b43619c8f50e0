"""A sweep file and the runs it names.

A sweep file is a Python file with `get_sweep()` returning a dict:

    base_config   path of the config file every run starts from (relative to the repository)
    overrides     {"train.steps": 200, ...}: applied to every run
    grid          {"rl.advantage": ["grpo", "rloo"], ...}: every combination is one arm
    arm_overrides {"advantage=gae": {"rl.value_head": "shared"}}: extra overrides for the
                  arms whose name has each of the key's comma-separated key=value parts
                  as a whole part (`matches`; optional)
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
ambiguous). Its folder is that name with '/', '\\', '%', control characters and runs of dots
percent-encoded, so that no grid value makes a path out of the sweep folder
(`folder_name`); two arms whose values print alike (0.001 and 1e-3) would share one folder and
are refused. docs/sweeps.md is the user's guide.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import re
import runpy

from grpo_jax.unicode_text import lone_surrogate, surrogate_sentence
from grpo_jax.errors import first_line

SEED_AXES = ("none", "vmap", "map")
MAX_SEED = 2**32 - 1  # jax.random.key keeps 32 bits of a seed
MAX_FOLDER_BYTES = 200  # under the 255 bytes of a file name, with room for a suffix


class SweepError(ValueError):
  """A sweep file that cannot be run; the message names the value and the fix."""


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str
  values: dict  # grid key -> value
  overrides: dict  # every override of this arm (common ones, grid values, arm extras)
  config: str = ""  # its config file ("" = the sweep's base_config)
  program: str = "grpo_jax.main"  # the module its processes run
  folder: str = ""  # its folder under the sweep's (folder_name(name); "" = the name)

  @property
  def directory(self) -> str:
    return self.folder or self.name


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


def matches(key: str, arm_name: str) -> bool:
  """Whether an arm_overrides key names the arm: each of its comma-separated parts is a whole
  part of the name ("num_minibatches=1" is not "num_minibatches=16")."""
  return set(key.split(",")) <= set(arm_name.split(","))


def folder_name(name: str) -> str:
  """An arm's name as one folder name (module docstring): unchanged when it is already plain,
  so the folders of earlier sweeps keep their names; past MAX_FOLDER_BYTES, shortened and made
  unique by a hash of the whole name."""
  safe = "".join(f"%{ord(ch):02X}" if ch in "/\\%" or ord(ch) < 32 or ord(ch) == 127 else ch
                 for ch in name)
  safe = re.sub(r"\.{2,}", lambda run: "%2E" * len(run.group()), safe)
  if len(safe.encode()) > MAX_FOLDER_BYTES:
    head = safe.encode()[:MAX_FOLDER_BYTES - 13].decode(errors="ignore")
    safe = f"{head}~{hashlib.sha1(name.encode()).hexdigest()[:12]}"
  return safe


def _read_sweep_file(path: str) -> dict:
  """get_sweep()'s dict; SweepError naming the file when it is missing, does not load, has no
  get_sweep(), or that raises or returns something else."""
  if not os.path.isfile(path):
    raise SweepError(f"--sweep={path} is not a file; pass a sweep file such as "
                     f"configs/sweeps/estimators_tiny.py.")
  try:
    module = runpy.run_path(path)
  except Exception as e:  # noqa: BLE001  a user's sweep file may raise anything
    raise SweepError(f"{path} could not be loaded ({first_line(e)}); fix that file.") from None
  if not callable(module.get("get_sweep")):
    raise SweepError(f"{path} has no get_sweep() function; define one returning a dict "
                     f"(see grpo_jax/sweep/spec.py).")
  try:
    raw = module["get_sweep"]()
  except Exception as e:  # noqa: BLE001
    raise SweepError(f"{path}: get_sweep() raised {first_line(e)}; fix that file.") from None
  if not isinstance(raw, dict):
    raise SweepError(f"{path}: get_sweep() returned a {type(raw).__name__}; return a dict "
                     f"(see grpo_jax/sweep/spec.py).")
  for field in ("overrides", "grid", "arm_overrides", "recipes"):
    if not isinstance(raw.get(field, {}), dict):
      raise SweepError(f"{path}: {field}={raw[field]!r}; give a dict (see "
                       f"grpo_jax/sweep/spec.py).")
    bad = [k for k in raw.get(field, {}) if not isinstance(k, str) or not k]
    if bad:
      raise SweepError(f"{path}: {field} has the key {bad[0]!r}; its keys must be non-empty "
                       f"strings (config fields; arm names for arm_overrides).")
  found = lone_surrogate(raw)  # (unchecked: a UnicodeEncodeError naming no field)
  if found is not None:
    raise SweepError(f"{path}: get_sweep()'s {surrogate_sentence(found).removeprefix('has ')}; "
                     f"fix that text.")
  for key, extra in raw.get("arm_overrides", {}).items():  # (unchecked: a TypeError)
    if not isinstance(extra, dict):
      raise SweepError(f"{path}: arm_overrides[{key!r}]={extra!r}; give a dict of config "
                       f"fields, e.g. {{'rl.value_head': 'shared'}}.")
  return raw


def _seeds(raw: dict, path: str) -> tuple:
  """The sweep's seeds: distinct whole numbers in [0, MAX_SEED]."""
  seeds = raw.get("seeds", [0])
  if (not isinstance(seeds, (list, tuple)) or not seeds
      or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED
                 for s in seeds) or len(set(seeds)) != len(seeds)):
    raise SweepError(f"{path}: seeds={seeds!r}; give a list of distinct whole numbers in "
                     f"[0, {MAX_SEED}], e.g. [0, 1, 2].")
  return tuple(seeds)


def _check_distinct_folders(arms: list, path: str) -> None:
  """Two arms with one folder would share their runs and one row of the table twice."""
  seen = {}
  for arm in arms:
    other = seen.setdefault(arm.directory, arm)
    if other is not arm:
      raise SweepError(f"{path}: the grid values {other.values} and {arm.values} both name the "
                       f"arm {arm.name!r} (one folder, so the second would only resume the "
                       f"first's run); drop one of them (0.001 and 1e-3 are one number) or "
                       f"give values that print differently.")


def _recipe_problem(recipe) -> str | None:
  """What is wrong with a recipes entry, or None."""
  if not isinstance(recipe, dict):
    return f"is {recipe!r}, not a dict"
  if unknown := sorted(set(recipe) - {"config", "program"}):
    return f"has unknown key(s) {unknown}"
  bad = [k for k in ("config", "program")
         if (k in recipe or k == "config") and not (isinstance(recipe.get(k), str) and recipe[k])]
  return f"{bad[0]}={recipe.get(bad[0])!r} is not a non-empty string" if bad else None


def load_sweep(path: str, seed_axis: str | None = None) -> Sweep:
  """Reads and checks a sweep file; `seed_axis` (the launcher's --seed_axis) overrides its
  seed_axis before the checks."""
  raw = _read_sweep_file(path)
  known = {"base_config", "overrides", "grid", "arm_overrides", "seeds", "seed_axis", "recipes"}
  unknown = sorted(set(raw) - known)
  if unknown:
    raise SweepError(f"{path}: unknown sweep field(s) {unknown}; valid: {sorted(known)}.")
  if not isinstance(raw.get("base_config"), str) or not raw["base_config"]:
    raise SweepError(f"{path}: get_sweep() must name base_config, e.g. "
                     f"'configs/grpo_tiny.py'.")
  seeds = _seeds(raw, path)
  fix = "pass --seed_axis=none" if seed_axis else "set seed_axis='none'"
  seed_axis = seed_axis or raw.get("seed_axis", "none")
  if seed_axis not in SEED_AXES:
    raise SweepError(f"{path}: seed_axis={seed_axis!r} is unknown; valid: {SEED_AXES}.")
  grid = dict(raw.get("grid", {}))
  for key, values in grid.items():
    if not isinstance(values, (list, tuple)) or not values:
      raise SweepError(f"{path}: grid[{key!r}]={values!r}; give a non-empty list of values.")
  common = dict(raw.get("overrides", {}))
  extras = dict(raw.get("arm_overrides", {}))
  seeded = [where for where, fields in [("overrides", common), ("grid", grid)] + [
      (f"arm_overrides[{k!r}]", v) for k, v in extras.items()] if "seed" in fields]
  if seeded:  # it would come after each run's --config.seed and win: every seed one run
    raise SweepError(f"{path}: {seeded[0]} sets 'seed', which would make every seed of the "
                     f"sweep the same run; give the seeds as seeds=[...] alone.")
  recipes = dict(raw.get("recipes", {}))
  for name, recipe in recipes.items():
    problem = _recipe_problem(recipe)
    if problem:
      raise SweepError(f"{path}: recipes[{name!r}] {problem}; write it as {{'config': "
                       f"'configs/<name>.py', 'program': 'grpo_jax.main'}} (program optional).")
  for recipe in grid.get("recipe", ()):
    if not isinstance(recipes.get(recipe) if isinstance(recipe, str) else None, dict) or (
        "config" not in recipes[recipe]):
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
      if matches(pattern, name):
        overrides.update(extra)
    program = recipe.get("program", "grpo_jax.main")
    if program != "grpo_jax.main" and seed_axis != "none":
      raise SweepError(f"{path}: recipe {values['recipe']!r} runs {program}, which takes one seed "
                       f"per process; {fix}.")
    arms.append(Arm(name, values, overrides, recipe.get("config", ""), program,
                    folder_name(name)))
  unused = [p for p in extras if not any(matches(p, arm.name) for arm in arms)]
  if unused:  # a typo's override is refused, never dropped
    raise SweepError(f"{path}: arm_overrides key {unused[0]!r} is in no arm's name, so its "
                     f"overrides would never apply; the arms are "
                     f"{', '.join(a.name for a in arms)} (a key applies to every arm whose name "
                     f"has each of its comma-separated key=value parts).")
  _check_distinct_folders(arms, path)
  stem = os.path.splitext(os.path.basename(path))[0]
  return Sweep(stem, raw["base_config"], tuple(arms), seeds, seed_axis, tuple(grid))


@dataclasses.dataclass(frozen=True)
class Job:
  """One process: an arm's seeds (all of them in one program with a seed axis, else one)."""
  arm: Arm
  seeds: tuple
  workdir: str  # the --workdir of the process
  command: tuple  # starts with "python" (the runner uses its own interpreter)


def run_dir(sweep_dir: str, arm: Arm, seed: int) -> str:
  return os.path.join(sweep_dir, arm.directory, f"seed_{seed}")


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
      workdir = os.path.join(sweep_dir, arm.directory)
      out.append(Job(arm, seeds, workdir, tuple(
          base + [f"--workdir={workdir}", f"--vmap_seeds={','.join(map(str, seeds))}",
                  f"--seed_axis={sweep.seed_axis}"] + flags)))
  return out
