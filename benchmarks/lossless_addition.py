"""Task "addition_lossless": the addition task (grpo_jax/data/arithmetic.py) whose completions
are written as text with every sampled token, specials as <pad> <bos> <eos> <id:N>
(benchmarks/sleeping_reward_server.py's `lossless_text`), so that a remote reward reading the
text sees exactly the tokens the rule reward scores. Everything else (prompts, labels, rewards,
evaluation, warm-up) is the addition task's. Loaded by benchmarks/async_overlap_config.py through
config.imports = "benchmarks.lossless_addition".
"""

import numpy as np

from benchmarks.sleeping_reward_server import lossless_text
from grpo_jax.data.arithmetic import AdditionTask
from grpo_jax.data.task import register_task


@register_task("addition_lossless", capabilities=("step_rewards", "device", "warmup",
                                                    "supervised", "preference_pairs"))
class LosslessAdditionTask(AdditionTask):
  """AdditionTask with a decode that keeps every token of each row's mask."""

  def decode(self, completion_tokens, completion_mask) -> list[str]:
    return [lossless_text(t[m].tolist(), self.tokenizer) for t, m in
            zip(np.asarray(completion_tokens), np.asarray(completion_mask, bool))]
