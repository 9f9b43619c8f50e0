"""GRPO on 2-digit addition with a ~0.4M-parameter Llama-style model: learns on a 2-core CPU
in a few minutes.

    python -m grpo_jax.main --config=configs/grpo_tiny.py --workdir=/tmp/grpo_tiny

A short supervised warm-up first teaches the format and the sums, but shows the answer with
its carries dropped 3 times out of 4 (57+68=15), so greedy decoding starts mostly wrong on
problems with a carry; GRPO then has to find that the carried answer is the rewarded one.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = ml_collections.ConfigDict(dict(
      vocab_size=16, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=32, rope_theta=10_000.0, rms_norm_eps=1e-6,
      tie_embeddings=True, qkv_bias=False, qk_norm=False,
      param_dtype="float32", compute_dtype="float32"))

  c.task = ml_collections.ConfigDict(dict(
      name="addition", num_digits=2, test_size=500, fixed_width=True,
      reverse_answer=True))

  # Supervised warm-up (off for real checkpoints: steps=0).
  c.warmup = ml_collections.ConfigDict(dict(
      steps=1500, batch_size=128, learning_rate=3e-3, carry_drop_fraction=0.75))

  c.rollout = ml_collections.ConfigDict(dict(
      num_prompts=16,  # prompts per step
      group_size=8,  # G completions per prompt
      max_new_tokens=4, temperature=1.0, top_k=0, top_p=1.0))

  c.rl = ml_collections.ConfigDict(dict(
      advantage="grpo", advantage_eps=1e-6,
      clip_eps=0.2, kl_coef=0.04, loss_aggregation="token-mean",
      num_iterations=1,  # mu: passes over each rollout batch
      num_minibatches=1))  # optimizer steps per pass

  c.optim = ml_collections.ConfigDict(dict(
      learning_rate=3e-4, warmup_steps=5, weight_decay=0.0, b1=0.9, b2=0.99,
      max_grad_norm=1.0))

  c.train = ml_collections.ConfigDict(dict(
      steps=100, eval_every=20, eval_size=500, eval_batch_size=250))
  return c
