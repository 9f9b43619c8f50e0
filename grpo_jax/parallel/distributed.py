"""Multi-host start-up: jax.distributed.initialize driven by config.distributed or the
environment, and gathering host-side copies of global arrays.

config.distributed.mode:
  "none"      one process (the default; also what every single-host run uses);
  "auto"      let JAX detect the cluster: TPU VMs of a pod slice, SLURM (SLURM_* variables),
              Open MPI; the same command runs on every host;
  "explicit"  coordinator_address ("host:port"), num_processes and process_id from the config
              (or the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables,
              which launch/local_multihost.sh sets).
"""

from __future__ import annotations

import os

import jax
import numpy as np

from grpo_jax.errors import ConfigError

_initialized = False


def initialize(dist_cfg) -> None:
  """Starts JAX's multi-controller runtime once per process, as configured."""
  global _initialized
  mode = dist_cfg.mode if dist_cfg is not None else "none"
  if mode == "none" or _initialized:
    return
  if mode == "auto":
    jax.distributed.initialize()
  else:  # "explicit" (validate refuses any other mode)
    address = dist_cfg.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
    num = dist_cfg.num_processes if dist_cfg.num_processes > 0 else _env_int(
        "JAX_NUM_PROCESSES", "0")
    pid = dist_cfg.process_id if dist_cfg.process_id >= 0 else _env_int("JAX_PROCESS_ID", "-1")
    if not address or num < 1 or pid < 0:
      raise ConfigError(
          f"distributed.mode='explicit' needs a coordinator address, a process count and a "
          f"process id (got {address!r}, {num}, {pid}); set distributed.coordinator_address, "
          f"distributed.num_processes and distributed.process_id or the JAX_COORDINATOR_ADDRESS,"
          f" JAX_NUM_PROCESSES and JAX_PROCESS_ID variables.")
    jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)
  _initialized = True


def _env_int(name: str, default: str) -> int:
  """$name as a whole number, or a ConfigError naming it."""
  value = os.environ.get(name, default)
  try:
    return int(value)
  except ValueError:
    raise ConfigError(f"{name}={value!r} is not a whole number; export {name} as one (e.g. "
                      f"{name}={'2' if name == 'JAX_NUM_PROCESSES' else '0'}), or set "
                      f"distributed.{name[4:].lower()}.") from None


def is_main_process() -> bool:
  return jax.process_index() == 0


def to_host(tree):
  """NumPy copies of (possibly multi-host) global arrays, identical on every process."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  def gather(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(gather, tree)
