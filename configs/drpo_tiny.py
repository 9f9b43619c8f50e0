"""DRPO (arXiv 2510.04474; grpo_jax/rl/drpo.py) on addition that may show its work
(grpo_jax/data/addition_work.py): correct answers are 4 tokens ("570<eos>") or 9 with the
column sums first ("1507=570<eos>"); the warm-up shows the work on half of its targets.

    python -m grpo_jax.main --config=configs/drpo_tiny.py --workdir=/tmp/drpo_tiny

DRPO weights each prompt's correct completions by exp((1 - |o| / N) / lambda), normalised over
the correct ones, so the short correct answer is favoured but no correct answer is pushed down.
The comparison with GRPO and a length penalty in the reward is configs/sweeps/drpo_tiny.py.
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.task.name = "addition_work"
  c.rollout.max_new_tokens = 10
  # The authors' recipe: lambda 0.1, tau 10, delta 1e-4, beta 1e3 (the rl.drpo_* defaults);
  # two minibatches a step, so that the second one's trust region (KL to pi_old <= delta) acts.
  c.rl.update(dict(objective="drpo", kl_coef=0.0, num_minibatches=2))
  return c
