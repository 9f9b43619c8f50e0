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

from grpo_jax.config import rl_defaults
from grpo_jax.data.gsm8k import VERL_INSTRUCTION


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = ml_collections.ConfigDict(dict(
      path="",  # required: a local HF checkpoint folder (config.json, safetensors, tokenizer)
      param_dtype="float32", compute_dtype="bfloat16"))
  c.task = ml_collections.ConfigDict(dict(name="gsm8k"))
  c.data = ml_collections.ConfigDict(dict(
      source="jsonl",  # "jsonl" (data.path/{train,test}.jsonl) or "tfds" (prepared gsm8k)
      path="../shared/data/gsm8k", tfds_dir="",
      instruction=VERL_INSTRUCTION, use_chat_template=True, max_prompt_tokens=512))
  c.reward = ml_collections.ConfigDict(dict(
      name="gsm8k_strict",  # gsm8k_strict | gsm8k_flexible | gsm8k_format
      format_score=0.0))
  c.warmup = ml_collections.ConfigDict(dict(
      steps=0, batch_size=1, learning_rate=0.0, carry_drop_fraction=0.0))  # no warm-up
  c.rollout = ml_collections.ConfigDict(dict(
      num_prompts=128, group_size=5, max_new_tokens=512, temperature=1.0, top_k=0, top_p=1.0))
  c.rl = rl_defaults(advantage="grpo", advantage_eps=1e-6, kl_coef=0.001, kl_estimator="k3",
                     kl_in="loss", loss_aggregation="token-mean", num_iterations=1,
                     num_minibatches=4)
  c.optim = ml_collections.ConfigDict(dict(
      learning_rate=1e-6, warmup_steps=10, weight_decay=0.01, b1=0.9, b2=0.999,
      max_grad_norm=1.0))
  c.train = ml_collections.ConfigDict(dict(
      steps=875, eval_every=25, eval_size=1319, eval_batch_size=128, eval_pass_k=0,
      export=True,
      checkpoint_every=25,  # also at step 0, at the end and on SIGTERM (preemptible VMs)
      keep_checkpoints=3,
      max_consecutive_skips=20,  # stop after this many non-finite updates in a row
      on_reward_error="raise"))  # or "zero": score a failing reward 0 and count it
  # Devices: (data, fsdp, tensor) sizes, -1 = the rest; multi-host start-up (see README).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  c.distributed = ml_collections.ConfigDict(dict(
      mode="none", coordinator_address="", num_processes=0, process_id=-1))
  return c
