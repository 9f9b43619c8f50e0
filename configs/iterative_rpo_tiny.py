"""Iterative Reasoning Preference Optimization (Pang et al. 2024) on 2-digit addition: the tiny
recipe's warm-up as the start, then 3 rounds of 100 steps, each on pairs of the round's start
policy's own samples (8 samples of each of 1024 fresh training prompts, a correct answer
against a wrong one) with the RPO loss (DPO + NLL of the chosen answer), each round's reference
the last round's result.

    python -m grpo_jax.train_dpo --config=configs/iterative_rpo_tiny.py --workdir=/tmp/irpo_tiny
"""

from configs import dpo_tiny


def get_config():
  c = dpo_tiny.get_config()
  c.dpo.update(dict(loss="rpo", rpo_alpha=1.0, rounds=3, steps=100, round_prompts=1024,
                    pairs_per_prompt=1))
  return c
