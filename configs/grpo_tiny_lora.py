"""configs/grpo_tiny.py with LoRA: rank-8 adapters on every projection of the warmed-up tiny
model train, the base stays frozen and is the KL reference.

    python -m grpo_jax.main --config=configs/grpo_tiny_lora.py --workdir=/tmp/grpo_tiny_lora

The learning rate is 10x the full fine-tuning recipe's, verl's advice for LoRA
(docs/advance/ppo_lora.rst: "increase the value of learning rate by an order of magnitude").
"""

import ml_collections

from configs import grpo_tiny


def get_config() -> ml_collections.ConfigDict:
  c = grpo_tiny.get_config()
  c.lora.update(dict(rank=8, alpha=16.0, targets="all-linear"))
  c.optim.learning_rate = 2e-3
  return c
