"""Online DPO (grpo_jax/rl/online_dpo.py) on 2-digit addition: configs/grpo_tiny.py with one
switch, rl.objective = "online_dpo". Each step samples G = 8 completions for each of 16 prompts
as GRPO does, pairs each prompt's best-rewarded with its worst-rewarded completion (ties make no
pair) and takes a DPO step against the frozen warm-up policy, beta = rl.kl_coef.

    python -m grpo_jax.main --config=configs/online_dpo_tiny.py --workdir=/tmp/online_dpo_tiny
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.rl.update(dict(objective="online_dpo", kl_coef=0.1))
  return c
