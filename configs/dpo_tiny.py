"""DPO on 2-digit addition, from a random model in one command: the tiny recipe's warm-up (SFT
on answers shown with their carries dropped 9 times out of 10, so greedy decoding starts wrong on
problems with a carry) is the start and the frozen reference, then DPO on preference pairs made
from the task as the reward-model demo makes them (the right sum against the SFT policy's own
wrong samples, half of them, and synthetic wrong sums: carries dropped, a digit off, a random
sum, an answer cut short).

    python -m grpo_jax.train_dpo --config=configs/dpo_tiny.py --workdir=/tmp/dpo_tiny

Another loss of the family: --config.dpo.loss=ipo (cdpo, rdpo, kto, simpo, orpo, rpo; their
hyperparameters are dpo.beta, label_smoothing, rpo_alpha, simpo_gamma, desirable_weight,
undesirable_weight). Held-out greedy accuracy at step 0 (the SFT start) and every 100 steps in
metrics.jsonl (eval_accuracy), with the held-out pairs' reward accuracy and margin.
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.dpo.update(dict(loss="dpo", beta=0.1, steps=300, batch_size=64, eval_every=100,
                    train_pairs=20_000, test_pairs=500))
  c.optim.update(dict(learning_rate=1e-4, warmup_steps=30))
  c.train.checkpoint_every = 100
  return c
