"""GRPO on the tiny task with DeepSeek-V3.2's three changes to GRPO (arXiv 2512.02556, section
3.1; docs/variants.md#deepseek-v32s-changes-to-grpo): the KL term weighted by pi / pi_old (eq. (7),
rl.unbiased_kl), off-policy sequence masking (eq. (9), rl.opsm_delta, slime's default delta
1e-4), and the keep-sampling mask (rl.keep_sampling_mask: nucleus sampling at top_p 0.9, and
the update's policies renormalised over the tokens it left available). Two passes over each
rollout (rl.num_iterations=2) make the second pass's samples off-policy, which is what the
first two are for.

    python -m grpo_jax.main --config=configs/grpo_tiny_deepseek_v32.py --workdir=/tmp/dsv32
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.rollout.top_p = 0.9
  c.rl.update(dict(unbiased_kl=True, opsm_delta=1e-4, num_iterations=2,
                   keep_sampling_mask=True))
  return c
