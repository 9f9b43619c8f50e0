"""configs/grpo_gsm8k.py end to end on a tiny random Qwen2 checkpoint and the real GSM8K data:
2 training steps, evaluation, export, then the standalone evaluation of the export."""

import json
import os
import subprocess
import sys

import pytest

from tests.hf_fixtures import save_tiny_qwen2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.rollout.num_prompts=2", "--config.rollout.group_size=2",
         "--config.rollout.max_new_tokens=12", "--config.data.max_prompt_tokens=200",
         "--config.rl.num_minibatches=2", "--config.rl.num_micro_batches=1",
         "--config.train.eval_size=3",
         "--config.train.eval_batch_size=2", "--config.train.eval_every=1",
         "--config.train.eval_pass_k=2", "--config.data.path=tests/data/gsm8k",
         "--config.rollout.decode_slots=3"]  # the slot-refill engine for the 4 rollout rows


def _run(module, *args):
  out = subprocess.run([sys.executable, "-m", module, "--config=configs/grpo_gsm8k.py", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.slow
def test_gsm8k_recipe_trains_evaluates_and_exports(tmp_path):
  ckpt = save_tiny_qwen2(str(tmp_path / "ckpt"))
  work = tmp_path / "run"
  out = _run("grpo_jax.main", f"--workdir={work}", f"--config.model.path={ckpt}",
             "--config.train.steps=2", *SMALL)
  records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1, 2]
  for r in records:
    assert {"eval_accuracy", "eval_accuracy_flexible", "eval_pass_at_2"} <= set(r)
  for r in records[1:]:
    assert 0.0 <= r["reward_mean"] <= 1.0 and r["response_len"] > 0
  assert "dropped" in out.stdout  # long prompts were filtered, and said so
  export = work / "hf_export"
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(export))

  from transformers import AutoModelForCausalLM
  model = AutoModelForCausalLM.from_pretrained(export)
  assert model.config.model_type == "qwen2"
  ev = _run("grpo_jax.eval", f"--workdir={tmp_path / 'eval'}", f"--config.model.path={export}",
            *SMALL)
  result = json.loads((tmp_path / "eval" / "eval.json").read_text())
  assert set(result) == {"eval_accuracy", "eval_accuracy_flexible", "eval_pass_at_2"}
  # The exported policy is the trained one: the standalone greedy figures equal the run's last.
  assert result["eval_accuracy_flexible"] == records[-1]["eval_accuracy_flexible"]
  assert "eval_accuracy:" in ev.stdout
