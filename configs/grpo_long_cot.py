"""Long reasoning traces: DAPO on math from a 7B base model, 1k-token prompts and 20k-token
responses, each row's tokens split over the mesh's `context` axis (docs/meshes.md, "Context
parallelism"; the memory figures and the launch commands are there).

    # one 8 x H200 node (the default target)
    python -m grpo_jax.main --config=configs/grpo_long_cot.py --workdir=/runs/long_cot \\
        --config.model.path=/ckpt/qwen2.5-math-7b
    # a v5p-64 slice (32 chips), every worker (launch/tpu_pod.sh)
    python -m grpo_jax.main --config=configs/grpo_long_cot.py:v5p-64 \\
        --workdir=gs://BUCKET/long_cot --config.model.path=/ckpt/qwen2.5-math-7b

model.path: a local Hugging Face folder or a Hub id of a 7-8B base model: Qwen2.5-Math-7B
(`Qwen/Qwen2.5-Math-7B`, the default) or Qwen3-8B-Base (`Qwen/Qwen3-8B-Base`). Check the
checkpoint's max_position_embeddings against the 21,504-token rows; Qwen3-8B-Base's is
32,768.

DAPO's settings (Yu et al. 2025; Tunix's and verl's DAPO recipes): clip-higher (eps_low 0.2,
eps_high 0.28), no KL term, the token-level loss (token-mean over the batch), dynamic sampling
(groups whose G rewards are all equal are dropped and more prompts drawn), and the soft overlong
penalty over the last 4,096 of 20,480 response tokens; G = 16, lr 1e-6 with 10 warm-up steps,
weight decay 0.1, gradient clip 1.0; the reward: math-verify's equivalence of the final answer
(`pip install -e '.[math]'`) on DAPO-Math-17k (`data.source`, a hub id or a local copy).

Memory (benchmarks/scale.py at Qwen2.5-7B's shape, 1k + 32k tokens; docs/meshes.md): with the
tokens over 8 devices of `context`, weights and optimizer state over fsdp x context, remat full
and the vocabulary reached 1,024 positions at a time, one row per device of a micro-batch.
"""

import ml_collections

from grpo_jax.defaults import get_defaults

# target -> (mesh sizes, prompts per step, micro-batches): a micro-batch holds one row per
# device of data x fsdp (rows = prompts x G = 16 x 16 = 256).
TARGETS = {
    # 8 chips of 141 GB: tokens over all 8 (weights and state over them too: fsdp x context)
    "8xh200": (dict(data=1, fsdp=1, tensor=1, expert=1, context=8), 16, 256),
    # 32 chips of 95 GiB (v5p-64 counts TensorCores: 2 per chip, one jax device each chip)
    "v5p-64": (dict(data=1, fsdp=4, tensor=1, expert=1, context=8), 16, 64),
}


def get_config(target: str = "8xh200") -> ml_collections.ConfigDict:
  if target not in TARGETS:
    raise ValueError(f"configs/grpo_long_cot.py:{target}: use one of {', '.join(TARGETS)} "
                     f"(e.g. --config=configs/grpo_long_cot.py:v5p-64).")
  mesh, prompts, micro = TARGETS[target]
  c = get_defaults()
  c.model.update(dict(path="Qwen/Qwen2.5-Math-7B", compute_dtype="bfloat16", remat="full",
                      logits_chunk=1024))
  c.task.name = "table"
  c.data.update(dict(source="BytedTsinghua-SIA/DAPO-Math-17k", instruction="",
                     max_prompt_tokens=1024, prompt_bucket=256))
  c.reward.update(dict(name="", fns="math_verify", format_score=0.0))
  c.warmup.update(dict(steps=0, batch_size=1, learning_rate=0.0, carry_drop_fraction=0.0))
  c.rollout.update(dict(num_prompts=prompts, group_size=16, max_new_tokens=20_480,
                        temperature=1.0))
  c.rl.update(dict(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.0,
                   loss_aggregation="token-mean", dynamic_sampling=True,
                   overlong_buffer=4096, overlong_penalty=1.0, num_minibatches=1,
                   num_micro_batches=micro, shared_prompt_forward=False))
  c.optim.update(dict(learning_rate=1e-6, warmup_steps=10, weight_decay=0.1,
                      max_grad_norm=1.0))
  c.train.update(dict(steps=500, eval_every=25, eval_size=256, eval_batch_size=16,
                      checkpoint_every=25, export=True))
  c.mesh.update(mesh)
  return c
