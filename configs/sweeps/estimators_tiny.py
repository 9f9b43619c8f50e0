"""Advantage estimators x 3 seeds on the tiny addition task (configs/grpo_tiny.py).

    python launch/sweep.py --sweep=configs/sweeps/estimators_tiny.py --workdir=/tmp/est

Each arm's three seeds run as one vmapped program (grpo_jax/train/seeds.py). The committed
result is docs/sweeps/estimators_tiny/ (results.md, results.csv, runs.csv, the plots).
"""


def get_sweep():
  return dict(
      base_config="configs/grpo_tiny.py",
      overrides={},
      grid={"rl.advantage": ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"]},
      seeds=[0, 1, 2],
      seed_axis="vmap",
  )
