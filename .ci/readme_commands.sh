#!/usr/bin/env bash
# The README front page's commands, at small sizes, in the venv that `pip install -e .` alone
# made (no test extra): what a new user runs first must work without torch or the test extra's
# other packages (e.g. jinja2 for every chat template came in only through torch once).
# Usage: bash .ci/readme_commands.sh OUTDIR   (from the repository root, the venv active)
set -euo pipefail
OUT=${1:?usage: bash .ci/readme_commands.sh OUTDIR}
rm -rf "$OUT" && mkdir -p "$OUT"
step() { echo "--- readme: $*"; }

step "1. the tiny run (2 steps)"
python -m grpo_jax.main --config=configs/grpo_tiny.py --workdir="$OUT/grpo_tiny" \
  --config.warmup.steps=50 --config.train.steps=2 --config.train.eval_every=2 \
  --config.train.eval_size=50 --config.train.eval_batch_size=50 | tail -1
test -s "$OUT/grpo_tiny/curves.png"
step "   the same command again: a finished run says so"
python -m grpo_jax.main --config=configs/grpo_tiny.py --workdir="$OUT/grpo_tiny" \
  --config.warmup.steps=50 --config.train.steps=2 --config.train.eval_every=2 \
  --config.train.eval_size=50 --config.train.eval_batch_size=50 > "$OUT/again.txt"
grep -q "this run is finished.*nothing to do; a larger train.steps continues it" "$OUT/again.txt"

step "2. SmolLM2: fetch, 1 step with export, evaluate the export (2 prompts)"
if python -m grpo_jax.fetch_model smollm2-135m-instruct; then
  SMALL=(--config.train.steps=1 --config.train.eval_every=1 --config.train.eval_size=2
         --config.train.eval_batch_size=2 --config.rollout.num_prompts=2
         --config.rollout.group_size=2 --config.rollout.max_new_tokens=8)
  python -m grpo_jax.main --config=configs/grpo_smollm2.py --workdir="$OUT/grpo_smollm2" \
    --config.train.export=True "${SMALL[@]}" | tail -1
  python -m grpo_jax.eval --config=configs/grpo_smollm2.py --workdir="$OUT/smollm2_eval" \
    --config.model.path="$OUT/grpo_smollm2/hf_export" --config.train.eval_size=2 \
    --config.train.eval_batch_size=2 --config.rollout.max_new_tokens=8 | tail -1

  step "3. your own data and reward (the README's function, 40 rows, 1 step)"
  mkdir -p "$OUT/my_project"
  python - "$OUT/my_project" <<'EOF'
import json, random, re, sys
readme = open("README.md").read()
section = readme[readme.index("## Bring your own data and reward"):]
module = re.search(r"```python\n# my_rewards.py\n(.*?)```", section, re.S).group(1)
open(f"{sys.argv[1]}/my_rewards.py", "w").write(module)
rng = random.Random(0)
with open(f"{sys.argv[1]}/my_data.jsonl", "w") as f:
  for _ in range(40):
    a, b = rng.randrange(50), rng.randrange(50)
    f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
                        "answer": str(a + b)}) + "\n")
EOF
  REPO=$PWD
  (cd "$OUT/my_project" && PYTHONPATH=. python -m grpo_jax.main \
    --config="$REPO/configs/grpo_table.py" --workdir=runs/mine \
    --config.data.source=my_data.jsonl \
    --config.reward.fns=my_rewards:digit_share,answer_number --config.reward.fn_weights=0.5,1 \
    --config.train.steps=1 --config.rollout.num_prompts=2 --config.rollout.group_size=2 \
    --config.rollout.max_new_tokens=8 --config.train.eval_batch_size=4 | tail -1)
else
  echo "fetch_model failed (offline?): commands 2 and 3 skipped"
fi
step "4. the tool-calling policy (10 warm-up steps, 1 step, 8 held-out episodes)"
python -m grpo_jax.main --config=configs/grpo_calculator_tiny.py --workdir="$OUT/calc" \
  --config.warmup.steps=10 --config.train.steps=1 --config.train.eval_every=1 \
  --config.train.eval_size=8 --config.train.eval_batch_size=8 | tail -1
step "all passed"
