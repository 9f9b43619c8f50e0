"""GRPO on the tiny task with DeepSeek-V3.2's off-policy corrections (arXiv 2512.02556, section
3.1; README "DeepSeek-V3.2's off-policy corrections"): the KL term weighted by pi / pi_old
(eq. (7), rl.unbiased_kl) and off-policy sequence masking (eq. (9), rl.opsm_delta, slime's
default delta 1e-4). Two passes over each rollout (rl.num_iterations=2) make the second pass's
samples off-policy, which is what both corrections are for.

    python -m grpo_jax.main --config=configs/grpo_tiny_deepseek_v32.py --workdir=/tmp/dsv32
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.rl.update(dict(unbiased_kl=True, opsm_delta=1e-4, num_iterations=2))
  return c
