#!/usr/bin/env bash
# The InstructGPT pipeline on the tiny addition task, on a CPU, with no download:
#   1. SFT (the warm-up as a stage)            -> ROOT/sft  (hf_export: the policy)
#   2. a reward model on preference pairs      -> ROOT/rm   (metrics.jsonl: pair_accuracy;
#                                                              hf_export: the RM)
#   3. PPO with the learned RM as the only reward, the critic started from it
#                                              -> ROOT/ppo  (metrics.jsonl: eval_accuracy at
#                                                              step 0 = the SFT policy, and after)
# Usage: bash launch/rlhf_tiny.sh ROOT   (run from the repository root)
set -euo pipefail
ROOT=${1:?usage: bash launch/rlhf_tiny.sh ROOT}
ROOT=$(python -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "$ROOT")
cd "$(dirname "$0")/.."
start=$(date +%s)
python -m grpo_jax.train_sft --config=configs/rlhf_tiny_sft.py --workdir="$ROOT/sft"
python -m grpo_jax.train_rm --config="configs/rlhf_tiny_rm.py:$ROOT" --workdir="$ROOT/rm"
python -m grpo_jax.main --config="configs/rlhf_tiny_ppo.py:$ROOT" --workdir="$ROOT/ppo"
echo "rlhf_tiny: the three stages took $(( $(date +%s) - start )) s"
