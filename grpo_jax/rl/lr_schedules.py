"""The learning-rate schedules of optim.schedule (train/learner/state.make_optimizer): a linear
warm-up over optim.warmup_steps to the peak (none at 0: the peak from the first update), then
the peak held ("constant", verl's default), or lowered toward optim.final_lr_fraction x the peak,
linearly ("linear", TRL's default, there to 0) or along a half cosine ("cosine"). The decay
spans total - warm-up updates and reaches the final rate at update `total`, one after the run's
last, as transformers' get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup do (so
the last update of a linear decay to 0 runs at peak / (total - warm-up)); a warm-up as long as
the run never reaches the peak. Each maker takes (peak, warm-up steps, total updates, final
rate) and returns an optax schedule of the update count. Add one by name here."""

from __future__ import annotations

import optax


def _warmed_up(peak, warmup, after):
  """`after` (a schedule of the count since the warm-up) behind a linear warm-up from 0 to
  `peak` over `warmup` updates; `after` alone when warmup is 0."""
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def _constant_rate(peak, warmup, total, final):
  del total, final
  return _warmed_up(peak, warmup, optax.constant_schedule(peak))


def _linear_decay(peak, warmup, total, final):
  return _warmed_up(peak, warmup, optax.linear_schedule(peak, final, max(total - warmup, 1)))


def _cosine_decay(peak, warmup, total, final):
  alpha = 0.0 if peak == 0.0 else final / peak  # as optax.warmup_cosine_decay_schedule
  return _warmed_up(peak, warmup, optax.cosine_decay_schedule(
      peak, max(total, warmup + 1) - warmup, alpha))


LR_SCHEDULES = {"constant": _constant_rate, "linear": _linear_decay, "cosine": _cosine_decay}
