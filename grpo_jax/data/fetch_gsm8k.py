"""Writes GSM8K's train.jsonl and test.jsonl ({"question", "answer"} per line) into a folder,
through the `datasets` library (needs network once; `pip install -e '.[data]'`):

    python -m grpo_jax.data.fetch_gsm8k --out data/gsm8k

`configs/grpo_gsm8k.py` reads data.path = data/gsm8k by default (relative to where the run
starts). GSM8K (openai/gsm8k, config "main") is under the MIT licence.
"""

from __future__ import annotations

import argparse
import json
import os

SOURCE, CONFIG = "openai/gsm8k", "main"


def write_split(records, path: str) -> int:
  """Writes {"question", "answer"} lines to path (a temporary file renamed over it); returns
  the number written."""
  lines = [json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in records]
  with open(path + ".tmp", "w") as f:
    f.writelines(lines)
  os.replace(path + ".tmp", path)
  return len(lines)


def fetch(out: str, load_dataset=None) -> dict:
  """Downloads both splits into `out`; returns {split: lines written}."""
  if load_dataset is None:
    try:
      from datasets import load_dataset  # noqa: PLC0415
    except ImportError:
      raise SystemExit("error: fetching GSM8K needs the datasets library: pip install -e "
                       "'.[data]'.") from None
  os.makedirs(out, exist_ok=True)
  dataset = load_dataset(SOURCE, CONFIG)
  return {split: write_split(dataset[split], os.path.join(out, f"{split}.jsonl"))
          for split in ("train", "test")}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="data/gsm8k", help="folder to write train/test.jsonl")
  args = parser.parse_args(argv)
  counts = fetch(args.out)
  print(f"wrote {counts['train']} train and {counts['test']} test problems to {args.out}")


if __name__ == "__main__":
  main()
