#!/usr/bin/env bash
# N processes on this machine, each with D CPU devices, as one multi-host JAX job (what the
# multi-host test uses). Every process runs the same command; process 0 writes the outputs.
# Flags already in $XLA_FLAGS are kept; the device count is added to them.
#   launch/local_multihost.sh N D --config=configs/grpo_tiny.py --workdir=/tmp/mh [--config.x=y]
set -euo pipefail
num_processes=${1:?number of processes}; devices=${2:?CPU devices per process}; shift 2
port=${JAX_PORT:-$((20000 + RANDOM % 20000))}
pids=()
for ((i = 0; i < num_processes; i++)); do
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=${devices}" \
  JAX_PLATFORMS=cpu JAX_COORDINATOR_ADDRESS="127.0.0.1:${port}" \
  JAX_NUM_PROCESSES="${num_processes}" JAX_PROCESS_ID="${i}" \
    python -m grpo_jax.main "$@" --config.distributed.mode=explicit &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
