"""PPO with a value head and GAE on the tiny addition task (configs/grpo_tiny.py's task,
model and warm-up).

    python -m grpo_jax.main --config=configs/ppo_tiny.py --workdir=/tmp/ppo_tiny

One completion per prompt, the reward on the last token, the KL to the reference as a per-token
penalty in the reward (InstructGPT style), GAE with gamma = lambda = 1 (verl's defaults), a
clipped value loss (cliprange 0.5) on a value head that shares the policy's backbone.
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.rollout.num_prompts = 128
  c.rollout.group_size = 1
  # gamma = lam = 1, value_coef 0.5, value_clip_eps 0.5 and kl_coef 0.02 are grpo_tiny's.
  c.rl.update(dict(advantage="gae", whiten_advantages=True, value_head="shared",
                   kl_in="reward", num_iterations=2, num_minibatches=2))
  return c
