"""Preference optimisation, the DPO family (grpo_jax/train/stages/preference.py): python -m grpo_jax.train_dpo --config=... --workdir=DIR, an alias of
python -m grpo_jax.main --stage=dpo (the same flags and exit statuses)."""

from grpo_jax.main import alias

if __name__ == "__main__":
  alias("dpo")
