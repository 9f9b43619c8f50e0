"""Preference optimisation (DPO, cDPO, rDPO, IPO, KTO, SimPO, ORPO, RPO): python -m
grpo_jax.train_dpo --config=configs/<name>.py --workdir=DIR (grpo_jax/train/preference.py; the
flags and exit statuses of grpo_jax.main; resumes from WORKDIR's newest checkpoint)."""

from __future__ import annotations

from grpo_jax.main import _CONFIG, _WORKDIR, run_command, start


def main(argv):
  def run():
    from grpo_jax.train.preference import train_dpo  # noqa: PLC0415
    train_dpo(_CONFIG.value, _WORKDIR.value)
  run_command(argv, run)


if __name__ == "__main__":
  start(main)
