"""What jax found, said once at the start of a run: the backend, the devices and the hosts, and
a warning when an accelerator is visible to the machine but jax runs on the CPU (a GPU box
with the CPU wheel of jax trains, slowly, without an error)."""

from __future__ import annotations

import glob
import shutil

import jax

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
