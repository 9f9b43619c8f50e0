#!/usr/bin/env bash
# The GPU check as one prepared command on a lent device machine (docs/accelerators.md).
#
#   bash launch/device_check.sh --fetch     # here, once: the wheels the device image lacks -> .whl/
#   bash launch/device_check.sh [ARGS...]   # there: install .whl/, run the check into $OUT
#
# The device image (Python 3.12, jax 0.11.2 with CUDA 13, flax, optax, orbax, transformers,
# torch) lacks ml-collections, tensorboardX, gguf and qwix; .whl/ is ignored by git
# (.git/info/exclude) and travels with the run's `carry`. ARGS go to accelerator_check.py
# (e.g. --limit gsm8k=200, --xla-flags=--xla_gpu_autotune_level=0).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  for spec in ml-collections==1.1.0 tensorboardX==2.6.5 gguf==0.19.0 qwix==0.1.8; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$spec"
  done
  ls .whl
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 benchmarks/accelerator_check.py --out "${OUT:-/tmp/accelerator_check}" "$@"
