"""Bad inputs through a real `python -m grpo_jax.main` process: the README command run from
another folder, a bad field, and environment variables JAX reads at start-up (a platform this
machine lacks, a flag XLA rejects, on which it aborts the process from C++, a JAX_* value it
rejects at import). Each ends with exit status 2, one line on stderr, nothing written. (The
in-process cases are in tests/test_bad_inputs.py.)"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "grpo_tiny.py")


@pytest.mark.parametrize("argv,needle", [
    (["--config=configs/grpo_tiny.py"], "--config=configs/grpo_tiny.py: no such file"),
    ([f"--config={TINY}", "--config.optim.learning_rate=inf"], "optim.learning_rate=inf"),
], ids=["from_another_folder", "bad_field"])
def test_the_command_itself_prints_one_line_and_exits_2(tmp_path, argv, needle):
  """The README command run from another folder, and a bad field, through `python -m`."""
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", *argv,
                        f"--workdir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("variable,value,needle", [
    ("JAX_PLATFORMS", "cuda", "JAX_PLATFORMS='cuda' names a platform that JAX cannot start"),
    ("JAX_PLATFORMS", "gpu", "JAX_PLATFORMS='gpu' names a platform that JAX cannot start"),
    ("XLA_FLAGS", "--xla_no_such_flag=1", "XLA rejects XLA_FLAGS='--xla_no_such_flag=1': it "
     "does not know --xla_no_such_flag=1"),
    ("JAX_DEFAULT_MATMUL_PRECISION", "bogus", "JAX could not start under this environment "
     "(ValueError: Invalid value \"bogus\" for JAX flag jax_default_matmul_precision)"),
], ids=["jax_platforms_cuda", "jax_platforms_gpu", "xla_flags", "jax_variable"])
def test_an_environment_jax_cannot_start_is_one_sentence(tmp_path, variable, value, needle):
  """Variables that JAX reads at start-up (a platform this machine lacks; a flag XLA rejects,
  on which it aborts the process from C++): one line, exit 2, nothing written."""
  if variable == "JAX_PLATFORMS" and os.path.exists("/dev/nvidia0"):
    pytest.skip("this machine has a GPU")
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", f"--config={TINY}",
                        f"--workdir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, variable: value})
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr[-3000:]
  assert not (tmp_path / "run").exists()
