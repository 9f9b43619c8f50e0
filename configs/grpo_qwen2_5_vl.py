"""GRPO on a visual counting question with Qwen2.5-VL-3B-Instruct (issue 57's real-shape
recipe; an accelerator's run: the update's peak is 78.3 GiB by XLA's analysis on the CPU, an
upper bound, see below).

    hf download Qwen/Qwen2.5-VL-3B-Instruct --local-dir /ckpt/qwen2.5-vl-3b-instruct
    python -m grpo_jax.data.visual_count --out data/visual_count --variant count \\
        --train 20000 --test 500
    python -m grpo_jax.main --config=configs/grpo_qwen2_5_vl.py --workdir=/runs/vl_count \\
        --config.model.path=/ckpt/qwen2.5-vl-3b-instruct

The data: data/visual_count.py's counting rows ("How many <colour> shapes are in the image?",
answers 1-4, one 64 x 64 image each) as a table (task.name="table": {"prompt", "answer",
"images"} lines); each image resized to 448 x 448 pixels (data.image_size: Qwen2.5-VL's
16 x 16 = 256 image tokens) and run through the image processor's rules, its placeholder in the
chat template expanded to 256 tokens (grpo_jax/data/table_images.py). The reward: verl's GSM8K
format, a number after "####" (gsm8k_strict), which the counting answers are.

Where the values come from: verl's and EasyR1's Qwen2.5-VL GRPO examples keep the vision tower
trainable (freeze_vision_tower False), lr 1e-6, KL (k3) coef 0.01 in the loss, G = 5-8,
temperature 1.0; the lengths are the issue's real shape (1 image of 448 x 448 + up to 256 text
tokens, 256 new tokens). On one device the update runs 16 prompts x G 8 = 128 rows in 4
minibatches of 8 micro-batches (4 rows each): `python benchmarks/scale_vlm.py --what
rl_step,sampler_loop --rows 128 --group-size 8 --minibatches 4 --micro-batches 8 --remat full
--logits-chunk 64 --dtype bfloat16` (figures in benchmarks/RESULTS.md; measured by XLA:CPU's
analysis, which holds a float32 copy of bf16 weights a GPU would not: an upper bound).
"""

import ml_collections

from grpo_jax.data.gsm8k import VERL_INSTRUCTION
from grpo_jax.defaults import get_defaults


def get_config() -> ml_collections.ConfigDict:
  c = get_defaults()
  # model.path is required: a Qwen2.5-VL folder (config.json with its vision_config,
  # safetensors, tokenizer and chat template); its config.json sets every size.
  c.model.update(dict(compute_dtype="bfloat16", param_dtype="bfloat16", remat="full",
                      logits_chunk=64))
  c.model.vision = ml_collections.ConfigDict(dict(train_tower=True))
  c.task.name = "table"
  c.data.update(dict(source="data/visual_count", image_size=448, max_prompt_tokens=512,
                     instruction=VERL_INSTRUCTION, prompt_bucket=32))
  c.reward.name = "gsm8k_strict"
  c.warmup.update(dict(steps=0, batch_size=1, learning_rate=0.0, carry_drop_fraction=0.0))
  c.rollout.update(dict(num_prompts=16, group_size=8, max_new_tokens=256, temperature=1.0))
  c.rl.update(dict(kl_coef=0.01, num_minibatches=4, num_micro_batches=8))
  c.optim.update(dict(learning_rate=1e-6, warmup_steps=10, weight_decay=0.01, b2=0.999))
  c.train.update(dict(steps=500, eval_every=25, eval_size=500, eval_batch_size=64,
                      checkpoint_every=25))
  return c
