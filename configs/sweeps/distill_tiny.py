"""On-policy distillation against GRPO from the same start, 3 seeds each (docs/dpo_family.md,
"On-policy distillation"): the tiny recipe's 0.4M-parameter student after its warm-up, trained
300 steps on the task's reward alone (GRPO) or on it plus the per-token reverse KL to a
3.2M-parameter teacher (configs/distill_tiny.py). Train the teacher first:

    python -m grpo_jax.main --config=configs/distill_tiny_teacher.py --workdir=/tmp/distill_tiny/teacher
    python launch/sweep.py --sweep=configs/sweeps/distill_tiny.py --workdir=/tmp/distill_sweep

The committed result is docs/sweeps/distill_tiny/.
"""


def get_sweep():
  return dict(
      base_config="configs/grpo_tiny.py",
      recipes={"grpo": {"config": "configs/grpo_tiny.py"},
               "distill": {"config": "configs/distill_tiny.py"}},
      grid={"recipe": ["grpo", "distill"]},
      seeds=[0, 1, 2],
  )
