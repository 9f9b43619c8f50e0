"""KTO on unpaired feedback, on 2-digit addition: the DPO demo's start (the tiny recipe's
warm-up), then KTO on {prompt, completion, label} records (every right answer desirable, one
wrong answer in three undesirable: 20,000 / 6,667 completions), made from the task's synthetic
pairs by launch/kto_unpaired_data.py:

    python launch/kto_unpaired_data.py --config=configs/dpo_tiny.py --out=/tmp/kto_unpaired
    python -m grpo_jax.train_dpo --config=configs/kto_unpaired_tiny.py --workdir=/tmp/kto_tiny

Other files: --config.dpo.train_path=... --config.dpo.test_path=... (the format:
docs/dpo.md#the-format). desirable_weight 1, undesirable_weight 1 (TRL's defaults; the KTO paper
suggests weights whose ratio w_D n_D / (w_U n_U) lies in [1, 4/3] for imbalanced sets).
"""

from configs import dpo_tiny


def get_config():
  c = dpo_tiny.get_config()
  c.dpo.update(dict(loss="kto", train_path="/tmp/kto_unpaired/train.jsonl",
                    test_path="/tmp/kto_unpaired/test.jsonl"))
  return c
