"""The learning-rate schedules of optim.schedule (train/learner/state.make_optimizer): a linear
warm-up over optim.warmup_steps to the peak, then the peak held ("constant", verl's default),
or lowered to optim.final_lr_fraction x the peak by the run's last update, linearly ("linear",
TRL's default, there to 0) or along a half cosine ("cosine"). Each maker takes (peak, warm-up
steps, total updates, final rate) and returns an optax schedule of the update count. Add one by
name here."""

from __future__ import annotations

import optax


def _constant_rate(peak, warmup, total, final):
  del total, final
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup),
                               optax.constant_schedule(peak)], [warmup])


def _linear_decay(peak, warmup, total, final):
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup),
                               optax.linear_schedule(peak, final, max(total - warmup, 1))],
                              [warmup])


def _cosine_decay(peak, warmup, total, final):
  return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(total, warmup + 1), final)


LR_SCHEDULES = {"constant": _constant_rate, "linear": _linear_decay, "cosine": _cosine_decay}


