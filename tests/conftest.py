"""Pytest fixtures; the helpers tests import live in tests/fixtures.py."""

import gc
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.fixtures import TEST_XLA_FLAGS, tiny_model_config

# Every test's seconds, for .ci/run and benchmarks/suite_time.py (the hooks pytest calls).
from tests.durations_plugin import (  # noqa: E402,F401
    pytest_runtest_logreport, pytest_sessionfinish, pytest_sessionstart)


# The XLA flags this session compiles with (a worker inherits $GRPO_JAX_TEST_XLA_FLAGS, if set).
_SESSION_XLA_FLAGS = os.environ.get("GRPO_JAX_TEST_XLA_FLAGS", TEST_XLA_FLAGS).split()

# The session's cache settings: environment variable (what the workers and the runs tests
# start read) -> (jax option, its type, the default here).
_CACHE_SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": ("jax_persistent_cache_min_compile_time_secs",
                                                   float, "0.1"),
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": ("jax_persistent_cache_min_entry_size_bytes",
                                                  int, "0"),
    "JAX_COMPILATION_CACHE_MAX_SIZE": ("jax_compilation_cache_max_size", int, str(8 << 30)),
    "JAX_COMPILATION_CACHE_DIR": ("jax_compilation_cache_dir", str, None),
}


def pytest_configure(config):
  """The session's XLA flags (TEST_XLA_FLAGS, or $GRPO_JAX_TEST_XLA_FLAGS) added to $XLA_FLAGS,
  and one persistent JAX compilation cache for the whole session: the controller makes the folder
  (unless $JAX_COMPILATION_CACHE_DIR names one, which is then kept) before pytest-xdist starts
  its workers, which inherit the environment, as do the runs the tests start. A program compiled
  by one test (or worker, or run) is then read back by the next one that builds the same program
  instead of being compiled again: the tiny recipe's step, recompiled by every run of it and
  after each file's jax.clear_caches(). Every program that took 0.1 s or more is kept, and
  the size cap turns on JAX's file lock around each read and write, so the two workers and
  their subprocesses share the folder safely. The cache's key holds the program, the XLA
  flags, the jax version and the devices, so an entry is only read by the same program."""
  if hasattr(config, "workerinput"):
    return
  # The session's XLA flags, before any process starts XLA.
  os.environ["XLA_FLAGS"] = " ".join([*os.environ.get("XLA_FLAGS", "").split(),
                                      *_SESSION_XLA_FLAGS])
  if not os.environ["XLA_FLAGS"]:
    del os.environ["XLA_FLAGS"]
  else:  # checked once for the session (a child process, about a second), not by every run
    from grpo_jax.parallel.platform import check_xla_flags  # noqa: PLC0415
    check_xla_flags()  # sets $GRPO_JAX_XLA_FLAGS_CHECKED, which the workers and runs inherit
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    folder = tempfile.mkdtemp(prefix="grpo_jax_tests_xla_")
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
  import jax  # noqa: PLC0415  (imported already by tests.fixtures, before this hook)
  for name, (option, kind, default) in _CACHE_SETTINGS.items():
    if default is not None:
      os.environ.setdefault(name, default)
    jax.config.update(option, kind(os.environ[name]))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
  """@pytest.mark.xla_defaults: the test runs in a child pytest under XLA's default flags (the
  session's TEST_XLA_FLAGS taken out of $XLA_FLAGS), for a claim that holds for the programs
  XLA compiles by default, as a user's run does: two differently shaped programs (S seeds
  mapped in one, each seed alone) giving the same bits. Under -O0 with the elemental fusion
  emitters their reductions round differently (tests/README.md)."""
  if pyfuncitem.get_closest_marker("xla_defaults") is None or not _SESSION_XLA_FLAGS:
    return None
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in _SESSION_XLA_FLAGS]
  env = {k: v for k, v in os.environ.items() if k != "GRPO_JAX_TEST_DURATIONS"}
  env.update(GRPO_JAX_TEST_XLA_FLAGS="", XLA_FLAGS=" ".join(flags))
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
                        "-m", "", pyfuncitem.nodeid], cwd=str(pyfuncitem.config.rootpath),
                       env=env, capture_output=True, text=True, timeout=900)
  if out.returncode != 0:
    pytest.fail(f"under XLA's default flags:\n{out.stdout[-6000:]}{out.stderr[-2000:]}",
                pytrace=False)
  return True


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
  """Frees the module's compiled XLA programs when its tests are done. Every executable JAX
  keeps in its caches holds about 6 memory mappings (XLA:CPU's JIT code and data), and a pytest
  worker runs hundreds of test files: kept all session, at the measured rate a worker reaches
  Linux's limit of 65,530 mappings per process (vm.max_map_count) late in the run, where a
  compilation's mmap fails and XLA takes the process down ("Fatal Python error: Aborted" in
  backend_compile_and_load; benchmarks/RESULTS.md)."""
  yield
  import jax  # noqa: PLC0415
  jax.clear_caches()
  gc.collect()


@pytest.fixture
def tiny_cfg():
  return tiny_model_config()


@pytest.fixture
def first_token_parity_reward():
  """A reward registered by the tests alone (no edit of grpo_jax/): 1 if a completion's first
  token is even. A random policy's groups of 4 then have a reward spread about 7 times in 8."""
  import jax.numpy as jnp  # noqa: PLC0415

  from grpo_jax.rewards.registry import REWARDS, register_reward  # noqa: PLC0415
  register_reward("first_token_even", kind="tokens")(
      lambda tokens, mask, targets, target_mask: (tokens[:, 0] % 2 == 0).astype(jnp.float32))
  yield "first_token_even"
  REWARDS.unregister("first_token_even")


@pytest.fixture(scope="session")
def env(tmp_path_factory):
  """Environment for tiny command-line runs, sharing one persistent compilation cache."""
  from tests.tiny_runs import cache_env  # noqa: PLC0415
  return cache_env(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture(scope="session")
def reference(tmp_path_factory, env):
  """The uninterrupted tiny run of 2N steps (tests/tiny_runs.py): (workdir, metrics records).
  Run once for the whole session: the first worker to need it runs it under a file lock in the
  folder both xdist workers' temporary folders share; the other reads it (tests only read it,
  or copy it). It took 58-62 s of a worker's time in CI, once per worker."""
  from filelock import FileLock  # noqa: PLC0415  (transformers' dependency)

  from tests.tiny_runs import records, run  # noqa: PLC0415
  base = tmp_path_factory.getbasetemp()
  shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  workdir = shared / "reference" / "run"
  with FileLock(str(shared / "reference.lock")):
    if not (shared / "reference" / "done").exists():
      shutil.rmtree(workdir, ignore_errors=True)
      run(workdir, env)
      (shared / "reference" / "done").touch()
  return workdir, records(workdir)
