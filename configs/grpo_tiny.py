"""GRPO on 2-digit addition with a ~0.4M-parameter Llama-style model: learns on a 2-core CPU
in about two minutes (the whole command: 94-102 s on a 2-core AMD EPYC, 123 s on a 2-core Intel
Xeon; README "Three commands", docs/tiny_run.md).

    python -m grpo_jax.main --config=configs/grpo_tiny.py --workdir=/tmp/grpo_tiny

A short supervised warm-up first teaches the format and the sums, but shows the answer with
its carries dropped 9 times out of 10 (57+68 -> 15, not 125), so greedy decoding starts wrong on
problems with a carry; GRPO then has to find that the carried answer is the rewarded one.
"""

import ml_collections

from grpo_jax.defaults import get_defaults


def get_config() -> ml_collections.ConfigDict:
  # The defaults are this recipe's model, task, warm-up, rollout, optimizer and training.
  c = get_defaults()
  # GRPO: group-normalised advantages, PPO clip 0.2, k3 KL in the loss (every field, its
  # default and its doc: python -m grpo_jax.main --config=configs/grpo_tiny.py --print_config).
  c.rl.kl_coef = 0.02
  return c
