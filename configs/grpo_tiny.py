"""GRPO on 2-digit addition with a ~0.4M-parameter Llama-style model: learns on a 2-core CPU
in a few minutes.

    python -m grpo_jax.main --config=configs/grpo_tiny.py --workdir=/tmp/grpo_tiny

A short supervised warm-up first teaches the format and the sums, but shows the answer with
its carries dropped 9 times out of 10 (57+68 -> 15, not 125), so greedy decoding starts wrong on
problems with a carry; GRPO then has to find that the carried answer is the rewarded one.
"""

import ml_collections

from grpo_jax.config import rl_defaults


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = ml_collections.ConfigDict(dict(
      vocab_size=16, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=32, rope_theta=10_000.0, rms_norm_eps=1e-6,
      tie_embeddings=True, qkv_bias=False, qk_norm=False,
      param_dtype="float32", compute_dtype="float32"))

  c.task = ml_collections.ConfigDict(dict(
      name="addition", num_digits=2, test_size=500, fixed_width=True, reverse_answer=True))

  # Supervised warm-up (off for real checkpoints: steps=0).
  c.warmup = ml_collections.ConfigDict(dict(
      steps=1000, batch_size=128, learning_rate=1e-3, carry_drop_fraction=0.9))

  c.rollout = ml_collections.ConfigDict(dict(
      num_prompts=16,  # prompts per step
      group_size=8,  # G completions per prompt
      max_new_tokens=4, temperature=1.0, top_k=0, top_p=1.0))

  # GRPO: group-normalised advantages, PPO clip 0.2, k3 KL in the loss (see grpo_jax/config.py
  # for every field and its source).
  c.rl = rl_defaults(advantage="grpo", kl_coef=0.02, loss_aggregation="token-mean")

  c.optim = ml_collections.ConfigDict(dict(
      learning_rate=2e-4, warmup_steps=30, weight_decay=0.0, b1=0.9, b2=0.99,
      max_grad_norm=1.0))

  c.train = ml_collections.ConfigDict(dict(
      steps=300, eval_every=30, eval_size=500, eval_batch_size=250, eval_pass_k=0,
      export=False,
      checkpoint_every=50,  # also at step 0, at the end and on SIGTERM; 0 = only those last two
      keep_checkpoints=3,  # the newest K (a damaged newest one falls back to the one before)
      max_consecutive_skips=20,  # stop after this many non-finite updates in a row
      on_reward_error="raise"))  # a reward that raises / is not finite: "raise" or "zero"
  # Devices: (data, fsdp, tensor) sizes, -1 = the rest; multi-host start-up (see README).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  c.distributed = ml_collections.ConfigDict(dict(
      mode="none", coordinator_address="", num_processes=0, process_id=-1))
  return c
