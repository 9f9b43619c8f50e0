"""Training-Free GRPO: python -m grpo_jax.train_training_free --config=configs/<name>.py
--workdir=DIR (grpo_jax/training_free/loop.py; the flags and exit statuses of grpo_jax.main)."""

from __future__ import annotations

from grpo_jax.main import _CONFIG, _WORKDIR, run_command, start


def main(argv):
  def run():
    from grpo_jax.training_free.loop import train_training_free  # noqa: PLC0415
    train_training_free(_CONFIG.value, _WORKDIR.value)
  run_command(argv, run)


if __name__ == "__main__":
  start(main)
