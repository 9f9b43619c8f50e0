"""Entry point: python -m grpo_jax.main --config=configs/<name>.py --workdir=DIR [--config.x=y]
[--stage=rl|sft|rm|dpo|training_free] (grpo_jax/stages.py)."""

from __future__ import annotations

import logging as std_logging
import os
import runpy
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from grpo_jax.errors import (command_line_returned, first_line, last_word_stream,
                             mute_after_a_failed_save)
from grpo_jax.interrupts import HostInterrupted


def _import_jax() -> None:
  """JAX reads its JAX_* variables when imported and raises on a value it rejects (e.g.
  JAX_DEFAULT_MATMUL_PRECISION=bogus): one line and exit 2, not its traceback."""
  try:
    import jax  # noqa: F401,PLC0415
  except Exception as e:  # noqa: BLE001
    print(f"error: JAX could not start under this environment ({first_line(e)}); fix or unset "
          f"that variable.", file=sys.stderr)
    sys.exit(2)


_import_jax()
from grpo_jax.config import ConfigError  # noqa: E402  (after JAX's own start-up)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to an ml_collections config file (configs/*.py). Override any field "
    "with --config.<section>.<field>=<value>; list every field, its value and its one-line doc "
    "with --print_config.", lock_config=True)
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Print the resolved config (the file with its --config.* overrides), "
    "each field with its one-line doc, and exit; needs no --workdir.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for every output of the run.")
_VMAP_SEEDS = flags.DEFINE_list(
    "vmap_seeds", None, "Run these seeds (e.g. 0,1,2) of the config as one vmapped program, "
    "writing WORKDIR/seed_<s>/; config.seed is then ignored (grpo_jax/train/run/seed_axis.py).")
_SEED_AXIS = flags.DEFINE_enum(
    "seed_axis", "vmap", ["vmap", "map"], "With --vmap_seeds: batch the seeds (vmap: fastest; "
    "equal to separate runs up to float rounding) or loop over them inside the one program "
    "(map: bit-identical to separate runs).")
_STAGE = flags.DEFINE_string(
    "stage", "rl", "What to run: rl (default), sft, rm, dpo, training_free, or a stage a "
    "config.imports file registers (grpo_jax/stages.py).")
flags.mark_flags_as_required(["config"])  # --workdir is checked in main, in one sentence


def _config_path(argv: list[str]) -> str | None:
  values = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
  if not values and "--config" in argv[:-1]:
    values = [argv[argv.index("--config") + 1]]
  return values[-1] if values else None


def explain_parse_error(argv: list[str], error: Exception) -> str:
  """One sentence for a command line that absl could not parse: a missing or broken config
  file, a `get_config` that raises, an --config.a.b=v whose path is not a field, or absl's own
  message."""
  path = _config_path(argv)
  if path is None:
    return ("--config is required: the recipe to run, e.g. --config=configs/grpo_tiny.py."
            if not any(a.startswith("--config") for a in argv) else
            f"could not parse the command line ({first_line(error)}).")
  spec = path.split(":", 1)[0]  # config_flags allows --config=file.py:argument
  if not os.path.isfile(spec):
    return (f"--config={path}: no such file (looked for {os.path.abspath(spec)} from the "
            f"current directory {os.getcwd()}); run from the repository root or give the "
            f"config's full path.")
  try:
    module = runpy.run_path(spec)
  except (Exception, SystemExit) as e:  # noqa: BLE001  a user's config file may raise anything
    return f"--config={path} could not be loaded ({first_line(e)}); fix that file."
  if "get_config" not in module:
    return f"--config={path} defines no get_config(); a config file must define one."
  try:
    config = module["get_config"]()
  except (Exception, SystemExit) as e:  # noqa: BLE001
    return f"--config={path}: get_config() raised {first_line(e)}; fix that file."
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
  return f"could not parse the command line ({first_line(error)})."


def parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except (Exception, SystemExit) as e:  # noqa: BLE001  absl/ml_collections raise several types
    # SystemExit: --help's own exit (passed on), or a config file calling sys.exit
    if isinstance(e, SystemExit) and any(
        a.split("=")[0] in ("-h", "-?", "--help", "--helpfull", "--helpshort", "--helpxml")
        for a in argv[1:]):
      raise
    print(f"error: {explain_parse_error(argv, e)}", file=sys.stderr)
    sys.exit(2)


def _fail(message: str, code: int):
  # One write of the whole line: processes of a multi-host job share one stderr, and print()'s
  # separate write of the newline let another process's line in between.
  stream = last_word_stream()
  stream.write(f"error: {' '.join(str(message).splitlines())}\n")
  stream.flush()
  sys.exit(code)


def _loaded_config():
  """The config; exits with one line (status 2) when its file could not be loaded."""
  try:  # config_flags defers a config file's load error to the first use of the config
    _CONFIG.value.get("seed")
  except (Exception, SystemExit) as e:  # noqa: BLE001  (a sys.exit in the file: not a success)
    _fail(explain_parse_error(sys.argv, e), 2)
  return _CONFIG.value


def check_flags() -> None:
  """Exits with one line (status 2) when the config file could not be loaded, --workdir is
  missing or a Hub id in model.path cannot be fetched (grpo_jax/models/hub.py); shared by
  grpo_jax.eval."""
  _loaded_config()
  if _WORKDIR.value is None:
    _fail("--workdir is required: the folder for the run's outputs, e.g. --workdir=/tmp/run.", 2)
  from grpo_jax.models.hub import resolve_config_model_path  # noqa: PLC0415
  try:  # a Hub id in model.path becomes its local snapshot, before the config is validated
    resolve_config_model_path(_CONFIG.value)
  except ConfigError as e:
    _fail(e, 2)


def cli(argv: list[str], entry=None) -> int:
  """The command line in this process (for tests): parse `argv` (without the program name),
  run `entry` (this module's main, or grpo_jax.eval's), and return the exit status it gives."""
  entry = entry or main
  flags.FLAGS.unparse_flags()
  for name in [n for n in flags.FLAGS if n.startswith("config.")]:
    delattr(flags.FLAGS, name)  # config_flags defines one flag per override at each parse
  saved, sys.argv = sys.argv, [sys.argv[0], *argv]  # config_flags reads overrides from it
  from grpo_jax.host_allocator import OPT_OUT_ENV  # noqa: PLC0415
  malloc = os.environ.get(OPT_OUT_ENV)
  os.environ[OPT_OUT_ENV] = "1"  # the calling process keeps its own allocator settings
  try:
    entry(parse_flags(sys.argv))
  except SystemExit as e:
    return int(e.code or 0)
  finally:
    command_line_returned()
    sys.argv = saved
    if malloc is None:
      os.environ.pop(OPT_OUT_ENV, None)
    else:
      os.environ[OPT_OUT_ENV] = malloc
  return 0


def main(argv):
  """Exit status: 0 done, 2 a bad config or input (one line, nothing written to the workdir),
  1 a run that cannot go on (too many skipped updates, a failing reward, a full disk), 143 / 130
  stopped by SIGTERM / SIGINT after checkpointing (run it again to resume)."""

  if _PRINT_CONFIG.value:
    from grpo_jax.config_docs import describe  # noqa: PLC0415
    config = _loaded_config()
    print(describe(config))
    if _STAGE.value == "rl":  # a value the run would refuse is named here, not only printed
      from grpo_jax.train.stages.rl_checks import check_rl_config  # noqa: PLC0415
      try:
        check_rl_config(config)
      except ConfigError as e:
        print(f"# a run of this config would stop at once: {e}", flush=True)
    return

  def run():
    from grpo_jax.registry import import_plugins  # noqa: PLC0415
    from grpo_jax.stages import STAGES  # noqa: PLC0415
    import_plugins(_CONFIG.value.get("imports", ""), log=lambda *_: None)  # (a stage's own)
    stage = STAGES.get(_STAGE.value)
    seeds = None
    if _VMAP_SEEDS.value:
      try:
        seeds = [int(s) for s in _VMAP_SEEDS.value]
      except ValueError:
        raise ConfigError(f"--vmap_seeds={','.join(_VMAP_SEEDS.value)} must be integers, e.g. "
                          f"--vmap_seeds=0,1,2.") from None
      if not all(0 <= s <= 2**32 - 1 for s in seeds):
        raise ConfigError(f"--vmap_seeds={','.join(_VMAP_SEEDS.value)}: use whole numbers in "
                          f"[0, {2**32 - 1}] (jax.random.key keeps 32 bits of a seed).")
    if seeds and _STAGE.value != "rl":
      raise ConfigError(f"--vmap_seeds runs seeds of the RL stage; --stage={_STAGE.value} runs "
                        f"one seed (config.seed): drop --vmap_seeds or run --stage=rl.")
    rl = dict(seeds=seeds, seed_axis=_SEED_AXIS.value) if _STAGE.value == "rl" else {}
    stage(_CONFIG.value, _WORKDIR.value, **rl)

  run_command(argv, run)


def alias(stage: str) -> None:
  """`python -m grpo_jax.train_<stage>`: grpo_jax.main with --stage=<stage> as its default."""
  flags.FLAGS.set_default("stage", stage)
  start(main)


def run_command(argv, run) -> None:
  """Runs run() (a command reading --config and --workdir: a stage, grpo_jax.eval) with the
  exit statuses of `main`."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  from grpo_jax.host_allocator import tune_host_allocator
  tune_host_allocator()  # before JAX starts its threads (see the module)
  mute_after_a_failed_save()  # the run's own sentence is the whole error (grpo_jax/errors.py)
  quiet_library_logs()
  from grpo_jax.train.run import faults  # imported late so that --help stays fast
  check_flags()
  from grpo_jax.parallel.platform import check_xla_flags  # noqa: PLC0415
  try:
    check_xla_flags()  # before this process starts XLA, which aborts on a flag it rejects
    run()
  except ConfigError as e:
    _fail(e, 2)
  except faults.RunStopped as e:
    _fail(e, 1)
  except faults.Preempted as e:
    print(str(e), file=sys.stderr, flush=True)
    sys.exit(e.exit_code)
  except KeyboardInterrupt:
    _fail("interrupted (SIGINT) before the loop could save; run the same command again to "
          "resume from the newest checkpoint, if there is one.", faults.INTERRUPTED_EXIT_CODE)
  except HostInterrupted as e:  # a signal in a host wait outside the loop (e.g. a probe)
    _fail(f"stopped by {e} before the loop could save; run the same command again to resume "
          f"from the newest checkpoint, if there is one.", 128 + e.signum)


def quiet_library_logs() -> None:
  """Unless --verbosity is given: absl's logger, through which orbax, tfds and jax's backend
  probe log, at CRITICAL: their warnings ("Metadata file does not exist" before our sentence on
  an unreadable checkpoint, "Unable to initialize backend 'tpu'") would stand around the run's
  own one-sentence errors. JAX's own loggers still show; --verbosity=0 shows all."""
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    logging.get_absl_logger().setLevel(std_logging.CRITICAL)


def start(entry) -> None:
  """`python -m` of a command (this one, its stage aliases, grpo_jax.eval):
  absl's app.run with our flag parsing, the run surviving a console closed under it."""
  from grpo_jax.console import survive_a_closed_console  # noqa: PLC0415
  survive_a_closed_console()
  app.run(entry, flags_parser=parse_flags)


if __name__ == "__main__":
  start(main)
