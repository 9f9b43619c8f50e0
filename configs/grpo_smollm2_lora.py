"""configs/grpo_smollm2.py with LoRA: only rank-32 adapters on every linear layer train (verl's
GRPO-LoRA settings: rank 32, alpha 32, all-linear), at 10x the full recipe's learning rate
(verl's ppo_lora.rst: "increase the value of learning rate by an order of magnitude"). The base
stays frozen in float32 on CPU; the adapters are written in PEFT's format to
workdir/peft_adapter at the end.

    python -m grpo_jax.main --config=configs/grpo_smollm2_lora.py --workdir=/tmp/smollm2_lora
"""

import ml_collections

from configs import grpo_smollm2


def get_config() -> ml_collections.ConfigDict:
  c = grpo_smollm2.get_config()
  c.lora.update(dict(rank=32, alpha=32.0, targets="all-linear", dropout=0.0,
                     export_adapter=True))
  c.optim.learning_rate = 1e-4
  return c
