#!/usr/bin/env bash
# A TPU pod slice: create it (optional), install the package on every worker, and run the same
# command everywhere; JAX finds the other hosts itself (distributed.mode=auto).
#   TPU=my-slice ZONE=us-east5-a TYPE=v5p-32 VERSION=v2-alpha-tpuv5 REPO=https://... \
#     launch/tpu_pod.sh --config=configs/grpo_gsm8k.py --workdir=gs://bucket/run \
#       --config.model.path=/ckpt/qwen2.5-0.5b-instruct --config.mesh.fsdp=-1 --config.mesh.data=1
set -euo pipefail
: "${TPU:?name of the TPU VM}" "${ZONE:?zone}"
if [[ "${CREATE:-0}" == 1 ]]; then
  gcloud compute tpus tpu-vm create "$TPU" --zone="$ZONE" --accelerator-type="${TYPE:?}" \
    --version="${VERSION:?}" ${SPOT:+--spot}
fi
args=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$TPU" --zone="$ZONE" --worker=all --command "
  set -e
  [ -d grpo_jax ] || git clone ${REPO:?git URL of this repository} grpo_jax
  cd grpo_jax && git pull -q && pip install -q -U 'jax[tpu]' -e .
  python -m grpo_jax.main${args} --config.distributed.mode=auto
"
