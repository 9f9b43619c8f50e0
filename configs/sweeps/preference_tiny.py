"""GRPO, online DPO, offline DPO and Iterative RPO on the tiny addition task, from the same
warm-up (SFT) start, in one sweep: one table and one eval_accuracy plot
(docs/dpo_family.md#measured-on-the-tiny-task).

    python launch/sweep.py --sweep=configs/sweeps/preference_tiny.py --workdir=/tmp/pref_sweep

GRPO and online DPO are RL runs of grpo_jax.main (300 steps of 16 prompts x 8 samples; online
DPO is configs/grpo_tiny.py with rl.objective="online_dpo"); DPO and Iterative RPO are runs of
the preference stage (grpo_jax.train_dpo: 300 optimizer steps of 64 pairs, offline pairs made
from the task, or 3 rounds of pairs of the policy's own samples). The x axis is each run's own
step. The committed result is docs/sweeps/preference_tiny/.
"""


def get_sweep():
  return dict(
      base_config="configs/grpo_tiny.py",
      recipes={
          "grpo": {"config": "configs/grpo_tiny.py"},
          "online_dpo": {"config": "configs/online_dpo_tiny.py"},
          "dpo": {"config": "configs/dpo_tiny.py", "program": "grpo_jax.train_dpo"},
          "iterative_rpo": {"config": "configs/iterative_rpo_tiny.py",
                            "program": "grpo_jax.train_dpo"},
      },
      grid={"recipe": ["grpo", "online_dpo", "dpo", "iterative_rpo"]},
      seeds=[0],
  )
