"""What jax found, said once at the start of a run: the backend, the devices and the hosts, and
a warning when an accelerator is visible to the machine but jax runs on the CPU (a GPU box
with the CPU wheel of jax trains, slowly, without an error)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import jax

from grpo_jax.errors import ConfigError, first_line

# Device files and tools an accelerator leaves on a machine, by kind.
_ACCELERATOR_SIGNS = {"GPU": ("/dev/nvidia0", "/dev/kfd"), "TPU": ("/dev/accel0", "/dev/vfio/0")}
_INSTALL = {"GPU": "pip install -U 'jax[cuda12]' (NVIDIA) or the ROCm build (AMD)",
            "TPU": "pip install -U 'jax[tpu]'"}


def visible_accelerator() -> str | None:
  """"GPU" or "TPU" when the machine shows one (device files, nvidia-smi), else None."""
  for kind, paths in _ACCELERATOR_SIGNS.items():
    if any(glob.glob(p) for p in paths):
      return kind
  return "GPU" if shutil.which("nvidia-smi") else None


def platform_line() -> str:
  """e.g. 'jax 0.10.2 on gpu: 8 x NVIDIA H100 80GB HBM3, 1 host'."""
  devices = jax.devices()
  kinds = sorted({d.device_kind for d in devices})
  hosts = jax.process_count()
  return (f"jax {jax.__version__} on {jax.default_backend()}: {len(devices)} x "
          f"{', '.join(kinds)}, {hosts} host{'s' if hosts > 1 else ''}")


def cpu_fallback_warning() -> str | None:
  """One sentence when an accelerator is visible but jax runs on the CPU, else None."""
  kind = visible_accelerator()
  if jax.default_backend() != "cpu" or kind is None:
    return None
  return (f"warning: this machine shows a {kind} but jax runs on the CPU (the jax installed "
          f"has no {kind} support); for the {kind}: {_INSTALL[kind]}.")


def start_backend(compilation_cache: str = "") -> list:
  """jax.devices(): the call that starts JAX's backend (after the multi-host start-up). A
  platform JAX cannot start here (JAX_PLATFORMS naming one this machine or the installed jax
  lacks) is one ConfigError sentence instead of JAX's traceback. Then JAX's persistent
  compilation cache goes where `compilation_cache` (train.compilation_cache) says, before the
  run's first compilation (compilation_cache_dir)."""
  try:
    devices = jax.devices()
    use_compilation_cache(compilation_cache)
    return devices
  except (RuntimeError, AssertionError) as e:
    asked = os.environ.get("JAX_PLATFORMS", "")
    if not asked and "Unable to initialize backend" not in str(e):
      raise  # not a platform choice (e.g. a multi-host start-up timeout): JAX's own error
    what = f"JAX_PLATFORMS={asked!r} names a platform" if asked else "the platform"
    reason = first_line(e).split(" (set JAX_PLATFORMS")[0]
    unset = "unset JAX_PLATFORMS to let JAX pick what is here, or " if asked else ""
    raise ConfigError(f"{what} that JAX cannot start on this machine ({reason}); {unset}install "
                      f"the jax build for it (GPU: {_INSTALL['GPU']}; TPU: "
                      f"{_INSTALL['TPU']}).") from None


def compilation_cache_dir(setting: str, backend: str) -> str | None:
  """Where JAX's persistent compilation cache lives for train.compilation_cache = `setting`:
  "auto" = $GRPO_JAX_COMPILATION_CACHE, else ~/.cache/grpo_jax/xla, on a GPU or TPU and off
  (None) on the CPU; "" = off; anything else is the folder. On one H200 the real-model recipe's
  first step took 140 s cold, most of it XLA's GEMM autotuning, and 6 s from a warm cache
  (benchmarks/RESULTS.md); on the CPU a compile costs far less than it does there, and the
  tests compile thousands of small programs, so "auto" leaves the CPU alone. The cache's key
  holds the program, the flags, the jax version and the devices, so a stale entry is never
  used."""
  if setting == "auto":
    if backend == "cpu":
      return None
    setting = (os.environ.get("GRPO_JAX_COMPILATION_CACHE")
               or os.path.join("~", ".cache", "grpo_jax", "xla"))
  return os.path.expanduser(setting) if setting else None


def use_compilation_cache(setting: str) -> None:
  """Points JAX's persistent compilation cache at compilation_cache_dir(setting), unless the
  user already set jax_compilation_cache_dir (e.g. $JAX_COMPILATION_CACHE_DIR), which wins."""
  if not setting or jax.config.jax_compilation_cache_dir:
    return
  path = compilation_cache_dir(setting, jax.default_backend())
  if path is not None:
    jax.config.update("jax_compilation_cache_dir", path)


# The XLA_FLAGS that check_xla_flags found good, in this process or a parent (inherited).
XLA_FLAGS_CHECKED = "GRPO_JAX_XLA_FLAGS_CHECKED"


def check_xla_flags() -> None:
  """XLA aborts the process (a C++ fatal error, before Python can catch anything) on a flag in
  XLA_FLAGS it does not know. When XLA_FLAGS is set, a child process starts XLA's CPU client
  under it first (about a second) and a flag it rejects becomes one ConfigError sentence.
  Flags found good are written to $GRPO_JAX_XLA_FLAGS_CHECKED, so the same flags are not
  checked again by this process or by the runs it starts (a sweep's jobs, a test session)."""
  flags = os.environ.get("XLA_FLAGS", "").strip()
  if not flags or os.environ.get(XLA_FLAGS_CHECKED) == flags:
    return
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  try:
    out = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                         capture_output=True, text=True, timeout=120)
  except (OSError, subprocess.TimeoutExpired):
    return  # the run itself will say what is wrong
  if out.returncode == 0:
    os.environ[XLA_FLAGS_CHECKED] = flags
    return
  found = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", out.stderr)
  detail = (f"it does not know {found.group(1).strip()}" if found else
            (out.stderr.strip().splitlines() or ["it failed to start"])[-1][:300])
  raise ConfigError(f"XLA rejects XLA_FLAGS={flags!r}: {detail}; remove or fix that flag.")


def devices_record(mesh=None) -> dict:
  """What a run's numbers depend on about the devices (recorded in run_info.json at each start,
  compared at a resume): platform, device kind and count, processes, and the mesh's shape."""
  devices = jax.devices()
  return {"platform": jax.default_backend(), "kind": devices[0].device_kind,
          "count": len(devices), "processes": jax.process_count(),
          "mesh": list(mesh.shape.values()) if mesh is not None else None}
