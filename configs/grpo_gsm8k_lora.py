"""configs/grpo_gsm8k.py with LoRA: verl's GSM8K GRPO-LoRA settings (its Qwen2.5-0.5B run scores
0.543 strict, docs/algo/baseline.md). Only the adapters train; the base is frozen in bfloat16
and is the KL reference; the adapters are written in PEFT's format to workdir/peft_adapter and
merged into a full checkpoint in workdir/hf_export.

    python -m grpo_jax.main --config=configs/grpo_gsm8k_lora.py --workdir=/runs/gsm8k_lora \\
        --config.model.path=/ckpt/qwen2.5-0.5b-instruct --config.data.path=/data/gsm8k

Sources (verl HEAD b178a3c):
  * lora.rank=32, lora.alpha=32, targets all-linear: examples/tuning/0.5b/
    qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh (lora_rank=32, lora_alpha=32,
    target_modules=all-linear), the settings of the 0.543 run (its log name: lorarank32);
    docs/advance/ppo_lora.rst recommends rank >= 32 ("for a 0.5B model, with lora_rank=32, the
    training convergence speed and final performance are almost identical to non-LoRA").
  * optim.learning_rate=3e-5: the same script (actor.optim.lr=3e-5), 30x the full recipe's
    1e-6; ppo_lora.rst: "increase the value of learning rate by an order of magnitude".
  * lora.dropout=0 (PEFT's default; verl sets none).
  * model.param_dtype=bfloat16: the frozen base needs no float32 master copy (the adapters and
    their AdamW moments stay float32).
Everything else (rollout, KL, batch, steps) is configs/grpo_gsm8k.py's.
"""

import ml_collections

from configs import grpo_gsm8k


def get_config() -> ml_collections.ConfigDict:
  c = grpo_gsm8k.get_config()
  c.lora.update(dict(rank=32, alpha=32.0, targets="all-linear", dropout=0.0,
                     export_adapter=True))
  c.optim.learning_rate = 3e-5
  c.model.param_dtype = "bfloat16"
  return c
