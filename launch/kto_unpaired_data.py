"""KTO's unpaired feedback made from a DPO config's task pairs: every chosen completion a
desirable record, one rejected completion in `--undesirable_every` an undesirable one (an
imbalanced set, as thumbs-up / thumbs-down data is), written as DIR/train.jsonl and
DIR/test.jsonl of {prompt, completion, label}. The pairs are the task's synthetic ones (no
model is run: dpo.policy_fraction does not apply).

    python launch/kto_unpaired_data.py --config=configs/dpo_tiny.py --out=/tmp/kto_unpaired
    python -m grpo_jax.train_dpo --config=configs/kto_unpaired_tiny.py --workdir=/tmp/kto_tiny
"""

import argparse
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from grpo_jax.data.supervised import write_jsonl  # noqa: E402
from grpo_jax.train.run.setup import build_task  # noqa: E402
from grpo_jax.train.stages.supervised import preference_pairs  # noqa: E402


def unpaired(pairs: list, undesirable_every: int) -> list:
  records = []
  for i, r in enumerate(pairs):
    records.append({"prompt": r["prompt"], "completion": r["chosen"], "label": True})
    if i % undesirable_every == 0:
      records.append({"prompt": r["prompt"], "completion": r["rejected"], "label": False})
  return records


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/dpo_tiny.py")
  parser.add_argument("--out", required=True)
  parser.add_argument("--undesirable_every", type=int, default=3)
  args = parser.parse_args()
  config = runpy.run_path(args.config)["get_config"]()
  task = build_task(config, log=lambda *a: None)
  for split in ("train", "test"):
    records = unpaired(preference_pairs(config, "dpo", task, split), args.undesirable_every)
    path = os.path.join(args.out, f"{split}.jsonl")
    write_jsonl(path, records)
    good = sum(r["label"] for r in records)
    print(f"{path}: {good} desirable, {len(records) - good} undesirable")


if __name__ == "__main__":
  main()
