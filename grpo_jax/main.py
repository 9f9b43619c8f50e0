"""Entry point: python -m grpo_jax.main --config=configs/<name>.py --workdir=DIR [--config.x=y]"""

from __future__ import annotations

import runpy
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from grpo_jax.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every output of the run.")
_VMAP_SEEDS = flags.DEFINE_list(
    "vmap_seeds", None, "Run these seeds (e.g. 0,1,2) of the config as one vmapped program, "
    "writing WORKDIR/seed_<s>/; config.seed is then ignored (grpo_jax/train/seed_axis.py).")
_SEED_AXIS = flags.DEFINE_enum(
    "seed_axis", "vmap", ["vmap", "map"], "With --vmap_seeds: batch the seeds (vmap: fastest; "
    "equal to separate runs up to float rounding) or loop over them inside the one program "
    "(map: bit-identical to separate runs).")
flags.mark_flags_as_required(["config", "workdir"])


def explain_bad_override(argv: list[str]) -> str | None:
  """Names the first --config.a.b=v whose path is not a field of the config file."""
  path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if path is None:
    return None
  try:
    config = runpy.run_path(path)["get_config"]()
  except Exception:  # noqa: BLE001  the file itself is broken: let absl report it
    return None
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    node, walked = config, []
    for part in arg[len("--config."):].split("=", 1)[0].split("."):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(walked) or "the top level"
        valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "(none: it is a value)"
        return (f"{arg.split('=', 1)[0]} is not a field of {path}: {where} has no field "
                f"{part!r}; valid fields there: {valid}.")
      node, walked = node[part], walked + [part]
  return None


def parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001  absl/ml_collections raise several types here
    message = explain_bad_override(argv) or f"could not parse the command line: {e}"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  """Exit status: 0 done, 2 a bad config, 1 a run that cannot go on (too many skipped
  updates, a failing reward), 143 stopped by SIGTERM after checkpointing (run it again to
  resume)."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  from grpo_jax.host_allocator import tune_host_allocator
  tune_host_allocator()  # before JAX starts its threads (see the module)
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  from grpo_jax.train import faults  # imported late so that --help stays fast
  from grpo_jax.train.loop import train
  try:
    seeds = None
    if _VMAP_SEEDS.value:
      try:
        seeds = [int(s) for s in _VMAP_SEEDS.value]
      except ValueError:
        raise ConfigError(f"--vmap_seeds={','.join(_VMAP_SEEDS.value)} must be integers, e.g. "
                          f"--vmap_seeds=0,1,2.") from None
    train(_CONFIG.value, _WORKDIR.value, seeds=seeds, seed_axis=_SEED_AXIS.value)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except faults.RunStopped as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  except faults.Preempted as e:
    print(str(e), file=sys.stderr, flush=True)
    sys.exit(faults.PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
