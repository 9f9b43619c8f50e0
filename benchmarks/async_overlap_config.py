"""configs/grpo_tiny.py scored by a remote reward server alone (benchmarks/async_overlap.py):

    python -m grpo_jax.main --workdir=/tmp/async_overlap \
        --config=benchmarks/async_overlap_config.py:http://127.0.0.1:8000/score

The text after the file's first ':' is the server's URL (ml_collections passes it to
get_config). The rule reward is off (reward.rule_weight=0) and every row of a step goes in one
request (batch_size far above any step's rows, one request in flight), so a step waits for the
server once. The task is "addition_lossless" (benchmarks/lossless_addition.py: the addition task
writing completions with every token), so benchmarks/sleeping_reward_server.py's reward equals
the rule reward on every row and the run learns exactly as configs/grpo_tiny.py does.
"""

import importlib.util
import os

ROWS_PER_REQUEST = 1 << 20  # above any step's num_prompts x group_size: one request per step


def _grpo_tiny():
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                      "grpo_tiny.py")
  spec = importlib.util.spec_from_file_location("grpo_tiny_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(url: str = "http://127.0.0.1:8000/score"):
  c = _grpo_tiny().get_config()
  c.imports = "benchmarks.lossless_addition"
  c.task.name = "addition_lossless"
  c.reward.rule_weight = 0.0
  c.reward.remote = [dict(url=url, name="sleeping", weight=1.0, batch_size=ROWS_PER_REQUEST,
                          max_concurrency=1, timeout_s=120.0, max_retries=0)]
  return c
