"""DAPO on the tiny addition task (configs/grpo_tiny.py's task, model and warm-up).

    python -m grpo_jax.main --config=configs/dapo_tiny.py --workdir=/tmp/dapo_tiny

Clip-higher (eps_low 0.2, eps_high 0.28), no KL term, token-mean loss, dynamic sampling (groups
whose G rewards are all equal are dropped and more prompts drawn, up to 4 extra rounds), and
the soft overlong penalty: answers take 4 tokens, the limit is 6, and the last 2 are the buffer
(Yu et al. 2025).
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.rollout.max_new_tokens = 6
  # GRPO advantages, clip_eps_low 0.2, token-mean, 4 extra rounds and penalty 1.0 are grpo_tiny's.
  c.rl.update(dict(clip_eps_high=0.28, kl_coef=0.0, dynamic_sampling=True, overlong_buffer=2))
  return c
