"""Pytest fixtures; the helpers tests import live in tests/fixtures.py."""

import gc

import pytest

from tests.fixtures import tiny_model_config


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
  """The uninterrupted tiny run of 2N steps (tests/tiny_runs.py): (workdir, metrics records)."""
  from tests.tiny_runs import records, run  # noqa: PLC0415
  workdir = tmp_path_factory.mktemp("reference") / "run"
  run(workdir, env)
  return workdir, records(workdir)
