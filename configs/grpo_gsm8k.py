"""The flagship recipe: GRPO on GSM8K from a Hugging Face checkpoint (e.g. Qwen2.5-0.5B-Instruct).

    hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir /ckpt/qwen2.5-0.5b-instruct
    python -m grpo_jax.main --config=configs/grpo_gsm8k.py --workdir=/runs/gsm8k \\
        --config.model.path=/ckpt/qwen2.5-0.5b-instruct --config.data.path=/data/gsm8k

Where each value comes from (verl's GSM8K GRPO example scripts and docs/algo/baseline.md, unless
noted; see ../shared/REFERENCES.md):
  * prompt: the chat template around the question + verl's instruction to answer after "####";
    reward: strict "#### <number>" extraction on the last 300 characters, format score 0.
  * rollout.group_size=5 (verl's rollout.n=5), temperature 1.0, no top-k/top-p.
  * optim.learning_rate=1e-6 (verl actor lr), AdamW, grad clip 1.0, weight decay 0.01.
  * rl: clip 0.2, KL in the loss with k3 ("low_var_kl") and beta=0.001, token-mean aggregation,
    GRPO eps 1e-6, mu=1 (verl's defaults).
  * batch: verl uses 1024 prompts/step in 4 minibatches of 256; one host here takes 128 prompts in
    4 minibatches of 32, the same 4 optimizer steps per rollout (scale num_prompts up with the
    device count).
  * lengths: 512 prompt tokens (verl max_prompt_length=512), 512 new tokens (a 0.5B model rarely
    needs more on GSM8K; verl's 7B example allows 1024).
  * steps: verl's Qwen2.5-0.5B PPO baseline runs 435 steps of 1024 prompts (15 epochs); 15 epochs
    of 128 prompts is 875 steps.
Published reference points (greedy, strict): Qwen2.5-0.5B-Instruct starts near 0.01 and reaches
0.54-0.57 with verl's GRPO-LoRA / PPO runs.
"""

import ml_collections

from grpo_jax.data.gsm8k import VERL_INSTRUCTION
from grpo_jax.defaults import get_defaults


def get_config() -> ml_collections.ConfigDict:
  c = get_defaults()
  # model.path is required: a local HF checkpoint folder (config.json, safetensors, tokenizer);
  # its config.json replaces the model sizes.
  c.model.compute_dtype = "bfloat16"
  # Memory at real sizes (docs/fitting.md#memory-at-real-shapes; benchmarks/scale.py): layers
  # scanned and rematerialised, the 152k vocabulary reached 64 completion positions at a time.
  # With 4 micro-batches (40 rows = 8 whole groups each) and each prompt run once for its 5
  # completions (rl.shared_prompt_forward) the update needs 21.6 GiB at Qwen2.5-0.5B by XLA's
  # analysis (27.96 GiB with every row's prompt run) and 27% fewer FLOPs.
  c.model.update(dict(remat="full", logits_chunk=64))
  c.task.name = "gsm8k"
  # data.source "jsonl": data.path/{train,test}.jsonl, relative to where the run starts;
  # `python -m grpo_jax.data.fetch_gsm8k --out data/gsm8k` writes them (needs network once).
  c.data.path = "data/gsm8k"
  c.data.instruction = VERL_INSTRUCTION  # 'Let's think step by step and output ... "####".'
  c.reward.name = "gsm8k_strict"  # gsm8k_strict | gsm8k_flexible | gsm8k_format
  # No warm-up (the supervised warm-up is for the synthetic task only).
  c.warmup.update(dict(steps=0, batch_size=1, learning_rate=0.0, carry_drop_fraction=0.0))
  c.rollout.update(dict(num_prompts=128, group_size=5, max_new_tokens=512))
  # The rest of rl is verl's defaults (rl_defaults): k3 KL in the loss, token-mean, eps 1e-6, mu=1.
  c.rl.update(dict(kl_coef=0.001, num_minibatches=4, num_micro_batches=4,
                   shared_prompt_forward=True))
  c.optim.update(dict(learning_rate=1e-6, warmup_steps=10, weight_decay=0.01, b2=0.999))
  c.train.update(dict(
      steps=875, eval_every=25, eval_size=1319, eval_batch_size=128, export=True,
      checkpoint_every=25))  # also at step 0, at the end and on SIGTERM (preemptible VMs)
  return c
