"""A run that says when it has no signal.

GRPO learns only from groups whose rewards differ: a step whose every group is tied (all
right, all wrong) has zero advantages, and with rl.skip_without_signal it leaves the policy
as it was (grpo_jax/train/learner/skips.py). Three places say so:

  * before the RL steps, after a supervised warm-up: the first step's batch, drawn and scored
    as the RL step will score it (and then drawn again by step 1, bit for bit), and the
    share of its G x P samples that earn a reward (`warmup_check_line`);
  * during the run: one line when train.no_signal_steps steps in a row have every group tied
    (`NoSignalWatch`), with the likely cause and the remedies' config fields;
  * at the end: the closing line counts the steps without signal (`no_signal_note`).
"""

from __future__ import annotations

import numpy as np

from grpo_jax.rl.objective import gradient_needs_advantages

# The record's share of groups whose rewards are all equal (train/run/metrics.py).
TIED = "frac_groups_all_same"


def _remedies(config) -> str:
  r, w = config.rollout, config.warmup
  fields = []
  if not config.rl.dynamic_sampling:
    fields.append("rl.dynamic_sampling=True (DAPO: tied groups are dropped and resampled, up "
                  f"to rl.max_extra_rollouts={config.rl.max_extra_rollouts} extra rounds)")
  fields.append(f"a larger rollout.group_size (now {r.group_size})")
  fields.append(f"a higher rollout.temperature (now {r.temperature:g})")
  if w.steps:
    fields.append(f"a longer or richer warm-up (warmup.steps, now {w.steps})")
  else:
    fields.append("a supervised warm-up first (warmup.steps)")
  return "; ".join(fields)


def warmup_check_line(rewards, group_size: int, config, label: str = "") -> str:
  """One line on the warmed-up policy's first batch: `rewards` its (P x G,) rewards. Says
  when no sample earned a reward (> 0), the case in which GRPO cannot start."""
  rewards = np.asarray(rewards, np.float64).reshape(-1)
  won = int(np.sum(rewards > 0))
  groups = rewards.reshape(-1, group_size)
  tied = float(np.mean(groups.min(1) == groups.max(1)))
  shape = f"{len(groups)} prompts x {group_size}"
  head = f"warm-up check{label}: the first batch's {len(rewards)} samples ({shape}), " \
         f"scored as the RL step scores them"
  if won == 0:
    return (f"{head}: none earns a reward (all <= 0, mean {rewards.mean():.3f}), so every "
            f"group is tied and GRPO has no signal to start from; the warm-up did not teach "
            f"the task's first success. Remedies: {_remedies(config)}.")
  return (f"{head}: {won} of {len(rewards)} earn a reward (success rate "
          f"{won / len(rewards):.3f}, mean reward {rewards.mean():.3f}); {tied:.0%} of the "
          f"groups tied.")


class NoSignalWatch:
  """Counts the steps in a row whose every group is tied; at the `after`-th (0: never) of a
  stretch, one line. `see(step, record)` once per step, in order."""

  def __init__(self, after: int, config, log, label: str = ""):
    self.after, self.config, self.log, self.label = after, config, log, label
    self.first, self.count = None, 0

  def see(self, step: int, record: dict) -> None:
    if record.get(TIED, 0.0) < 1.0:
      self.first, self.count = None, 0
      return
    if self.count == 0:
      self.first = step
    self.count += 1
    if self.after and self.count == self.after:
      self.log(no_signal_line(self.first, step, record, self.config, self.label))


def no_signal_line(first: int, last: int, record: dict, config, label: str = "") -> str:
  """`no signal{label}: steps 12-21, every group tied (at reward 0.000) ...`."""
  std = record.get("reward_std", None)
  at = (f"at reward {record['reward_mean']:.3f}" if std == 0.0 else
        f"each at its own reward, batch mean {record['reward_mean']:.3f}")
  if not gradient_needs_advantages(config.rl):  # a tied step's gradient is not 0
    skip = ("so only the loss's terms without advantages (the KL, entropy, value or "
            "distillation term) moved the policy")
  elif config.rl.skip_without_signal:
    skip = "so no update moved the policy (rl.skip_without_signal)"
  else:
    skip = "so only AdamW's momentum moved the policy (rl.skip_without_signal=False)"
  return (f"no signal{label}: steps {first}-{last}, every group tied ({at}), {skip}. Likely "
          f"cause: the policy's samples of a prompt all succeed or all fail, so GRPO's "
          f"advantages are 0. Remedies: {_remedies(config)}.")


def no_signal_note(records: list[dict]) -> str:
  """The closing line's count: `; 49 of 60 steps without signal (every group tied)` or ''."""
  steps = [r for r in records if TIED in r]
  tied = sum(r[TIED] >= 1.0 for r in steps)
  return f"; {tied} of {len(steps)} steps without signal (every group tied)" if tied else ""
