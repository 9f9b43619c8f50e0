"""DRPO against GRPO with a length penalty in the reward, 3 seeds each, on addition that may
show its work (configs/drpo_tiny.py; docs/variants.md, "DRPO").

    python launch/sweep.py --sweep=configs/sweeps/drpo_tiny.py --workdir=/tmp/drpo_sweep

GRPO's arm scores a correct completion 1 - 0.5 |o| / N (task.length_penalty = 0.5; N = 10), so
the short correct answer (4 tokens) gets 0.8 and the one that shows its work (9 tokens) 0.55;
DRPO's arm keeps the 0/1 reward and puts the length signal in its positive weights. Both use
the same minibatches, learning rate, warm-up and steps. The committed result is
docs/sweeps/drpo_tiny/.
"""


def get_sweep():
  return dict(
      base_config="configs/drpo_tiny.py",
      overrides={},
      grid={"rl.objective": ["policy_gradient", "drpo"]},
      arm_overrides={"objective=policy_gradient": {"task.length_penalty": 0.5}},
      seeds=[0, 1, 2],
      seed_axis="vmap",
  )
