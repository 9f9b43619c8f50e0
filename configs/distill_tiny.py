"""On-policy distillation on 2-digit addition (grpo_jax/rl/distill.py): the tiny recipe's
0.4M-parameter student, from the same warm-up, learns from its own samples with the task's
reward and the per-token reverse KL to a teacher 8 times larger (configs/distill_tiny_teacher.py,
trained by the tiny recipe first) as a per-token reward.

    python -m grpo_jax.main --config=configs/distill_tiny_teacher.py --workdir=ROOT/teacher
    python -m grpo_jax.main --config=configs/distill_tiny.py:ROOT --workdir=ROOT/student

rl.distill_coef (3: measured against 1 in docs/sweeps/distill_tiny/) weighs the teacher's
signal against the task's (GRPO's advantages of the rule reward); rl.distill_in="loss" puts it
in the loss instead (the k3 estimate, as the KL to the reference). The comparison with GRPO
from the same start is configs/sweeps/distill_tiny.py.
"""

from configs import grpo_tiny


def get_config(root: str = "/tmp/distill_tiny"):
  c = grpo_tiny.get_config()
  c.rl.update(dict(distill_teacher=f"{root}/teacher/hf_export", distill_coef=3.0,
                   distill_in="reward"))
  return c
