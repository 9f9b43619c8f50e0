"""Training-Free GRPO (grpo_jax/training_free/loop.py): python -m grpo_jax.train_training_free --config=... --workdir=DIR, an alias of
python -m grpo_jax.main --stage=training_free (the same flags and exit statuses)."""

from grpo_jax.main import alias

if __name__ == "__main__":
  alias("training_free")
