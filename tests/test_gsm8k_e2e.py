"""configs/grpo_gsm8k.py end to end on a tiny random Qwen2 checkpoint and the real GSM8K data:
2 training steps, evaluation, export, then the standalone evaluation of the export."""

import json
import os
import subprocess
import sys

import pytest

from tests.hf_fixtures import save_tiny_qwen2
from tests.tiny_runs import cache_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.rollout.num_prompts=2", "--config.rollout.group_size=2",
         "--config.rollout.max_new_tokens=12", "--config.data.max_prompt_tokens=200",
         "--config.rl.num_minibatches=2", "--config.rl.num_micro_batches=1",
         "--config.train.eval_size=3",
         "--config.train.eval_batch_size=2", "--config.train.eval_every=1",
         "--config.train.eval_pass_k=2", "--config.data.path=tests/data/gsm8k",
         "--config.rollout.decode_slots=3"]  # the slot-refill engine for the 4 rollout rows


def _run(module, *args, env=None):
  out = subprocess.run([sys.executable, "-m", module, "--config=configs/grpo_gsm8k.py", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


@pytest.mark.slow
def test_gsm8k_recipe_trains_evaluates_and_exports(tmp_path):
  ckpt = save_tiny_qwen2(str(tmp_path / "ckpt"))
  work = tmp_path / "run"
  env = cache_env(tmp_path / "jax_cache")  # the evaluation reruns the run's eval programs
  out = _run("grpo_jax.main", f"--workdir={work}", f"--config.model.path={ckpt}",
             "--config.train.steps=2", *SMALL, env=env)
  records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1, 2]
  for r in records:
    assert {"eval_accuracy", "eval_accuracy_flexible", "eval_pass_at_2"} <= set(r)
  for r in records[1:]:
    assert 0.0 <= r["reward_mean"] <= 1.0 and r["response_len"] > 0
  assert "skipped 113 rows: 113 prompts longer than" in out.stdout  # long prompts were filtered, and said so
  export = work / "hf_export"
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(export))

  from transformers import AutoModelForCausalLM
  model = AutoModelForCausalLM.from_pretrained(export)
  assert model.config.model_type == "qwen2"
  ev = _run("grpo_jax.eval", f"--workdir={tmp_path / 'eval'}", f"--config.model.path={export}",
            *SMALL, env=env)
  result = json.loads((tmp_path / "eval" / "eval.json").read_text())
  assert set(result) == {"eval_accuracy", "eval_accuracy_flexible", "eval_pass_at_2"}
  # The exported policy is the trained one: the standalone greedy figures equal the run's last.
  assert result["eval_accuracy_flexible"] == records[-1]["eval_accuracy_flexible"]
  assert "eval_accuracy:" in ev.stdout


@pytest.mark.slow
def test_gsm8k_lora_recipe_exports_a_peft_adapter_and_the_merged_policy(tmp_path):
  """configs/grpo_gsm8k_lora.py for 2 steps: PEFT loads workdir/peft_adapter onto the base
  checkpoint and gives the logits of workdir/hf_export (the adapters merged)."""
  import numpy as np
  import peft
  import torch
  from safetensors.numpy import load_file
  from transformers import AutoModelForCausalLM
  ckpt = save_tiny_qwen2(str(tmp_path / "ckpt"))
  work = tmp_path / "run"
  out = subprocess.run(
      [sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_gsm8k_lora.py",
       f"--workdir={work}", f"--config.model.path={ckpt}", "--config.train.steps=2",
       "--config.lora.rank=4", "--config.optim.learning_rate=1e-2",
       "--config.model.param_dtype=float32", "--config.rl.entropy_coef=0.1", *SMALL],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "exported the LoRA adapters in PEFT's format" in out.stdout
  tensors = load_file(str(work / "peft_adapter" / "adapter_model.safetensors"))
  assert len(tensors) == 2 * 7 * 2  # A and B of 7 projections in 2 layers
  # Trained (an entropy bonus gives a gradient although the random model earns no reward).
  assert max(np.abs(v).max() for k, v in tensors.items() if "lora_B" in k) > 0
  tokens = torch.tensor([[5, 17, 33, 2, 90, 11, 7]])
  with torch.no_grad():
    base = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    base_logits = base(tokens).logits
    adapted = peft.PeftModel.from_pretrained(base, work / "peft_adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(work / "hf_export").eval()
    a, m = adapted(tokens).logits, merged(tokens).logits
  np.testing.assert_allclose(a.numpy(), m.numpy(), atol=1e-4, rtol=0)
  assert (a - base_logits).abs().max() > 1e-4  # the run moved the policy
