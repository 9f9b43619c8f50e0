"""The tiny recipe (configs/grpo_tiny.py) with a mixture of experts in each layer: 4 SwiGLU
experts of half the dense MLP's width, 2 per token (so a token's MLP compute equals the dense
recipe's), routed as Qwen3-MoE routes (top-2 of the softmax, renormalised; models/moe.py).

    python -m grpo_jax.main --config=configs/grpo_tiny_moe.py --workdir=/tmp/grpo_tiny_moe
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.model.update(dict(family="qwen3_moe", num_experts=4, experts_per_token=2,
                      moe_intermediate_size=c.model.intermediate_size // 2, norm_topk_prob=True))
  return c
