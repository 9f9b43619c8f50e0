"""Stage 1 of the tiny InstructGPT pipeline (launch/rlhf_tiny.sh): SFT on the addition task.

    python -m grpo_jax.train_sft --config=configs/rlhf_tiny_sft.py --workdir=ROOT/sft

configs/grpo_tiny.py's model and warm-up (answers shown with their carries dropped 9 times out
of 10, so the policy starts partly right), as a stage of its own: the policy is exported to
ROOT/sft/hf_export, where the reward model and PPO start from.
"""

from configs import grpo_tiny


def get_config():
  return grpo_tiny.get_config()
