"""The reward-model stage (grpo_jax/train/stages/supervised.py): python -m grpo_jax.train_rm --config=... --workdir=DIR, an alias of
python -m grpo_jax.main --stage=rm (the same flags and exit statuses)."""

from grpo_jax.main import alias

if __name__ == "__main__":
  alias("rm")
