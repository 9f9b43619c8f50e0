"""Asynchronous RL's off-policy corrections, seeded (issue 56, item 4; docs/async.md): the tiny
GRPO recipe (configs/grpo_tiny.py) at rl.max_staleness 0, 1, 2 and 4, each with no correction,
token-level truncated IS (TIS), token-level masked IS (MIS / IcePop), CISPO and AReaL's
decoupled PPO, 3 seeds per arm in one vmapped program.

    python launch/sweep.py --sweep=configs/sweeps/async_corrections.py --workdir=/tmp/async_sweep

The launcher resumes an interrupted sweep (finished arms are kept). The committed result is
docs/sweeps/async_corrections/.
"""

CORRECTIONS = {"none": {}, "tis": {"rl.is_correction": "tis_token"},
               "mis": {"rl.is_correction": "mis_token"}, "cispo": {"rl.loss": "cispo"},
               "decoupled": {"rl.is_correction": "decoupled_ppo", "rl.decoupled_cap": 5.0}}


def get_sweep():
  return dict(
      base_config="configs/grpo_tiny.py",
      recipes={name: {"config": "configs/grpo_tiny.py"} for name in CORRECTIONS},
      grid={"rl.max_staleness": [0, 1, 2, 4], "recipe": list(CORRECTIONS)},
      arm_overrides={f"recipe={name}": fields for name, fields in CORRECTIONS.items() if fields},
      seeds=[0, 1, 2],
      seed_axis="vmap",
  )
