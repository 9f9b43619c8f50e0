"""The teacher of the tiny on-policy distillation demo (configs/distill_tiny.py): the tiny
recipe (configs/grpo_tiny.py: warm-up, then 300 GRPO steps) on a model 8 times larger (3.2M
parameters: 4 layers of width 256 against 2 of 128), exported as a Hugging Face folder to
ROOT/teacher/hf_export.

    python -m grpo_jax.main --config=configs/distill_tiny_teacher.py --workdir=ROOT/teacher
"""

from configs import grpo_tiny


def get_config():
  c = grpo_tiny.get_config()
  c.model.update(dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
                      num_kv_heads=4, head_dim=32))
  c.train.export = True
  return c
