"""Stage 2 of the tiny InstructGPT pipeline (launch/rlhf_tiny.sh): a reward model trained with
the Bradley-Terry loss on preference pairs made from the addition task (the right sum against a
wrong one: carries dropped, one digit off, a random sum, an answer cut short), started from the
SFT policy (its lm_head dropped, a zero score head; OpenRLHF's and TRL's start).

    python -m grpo_jax.train_rm --config=configs/rlhf_tiny_rm.py:ROOT --workdir=ROOT/rm

ROOT is the pipeline's folder (the SFT stage wrote ROOT/sft/hf_export). Held-out pairs: 500
made from the task's test problems.
"""

from configs import grpo_tiny


def get_config(root: str = "/tmp/rlhf_tiny"):
  c = grpo_tiny.get_config()
  c.model.path = f"{root}/sft/hf_export"
  c.warmup.steps = 0
  c.rm.update(dict(train_pairs=20_000, test_pairs=500, steps=600, batch_size=64,
                   eval_every=100))
  c.optim.update(dict(learning_rate=3e-4, warmup_steps=30))
  c.train.checkpoint_every = 200
  return c
