"""GRPO on your own data and reward, from config alone (task "table"; README "Bring your own
data and reward", docs/own_data.md):

    python -m grpo_jax.main --config=configs/grpo_table.py --workdir=/tmp/mine \\
        --config.data.source=my_data.jsonl --config.reward.fns=my_rewards:digit_share

data.source: a .jsonl / .json / .parquet / .csv file, a folder of them ({train,test}.<ext>),
a `datasets` save_to_disk folder, or a hub id. Each row has a "prompt" (a string, or a list of
{role, content}) or a "messages" list; its other columns reach the reward functions by name.
reward.fns: comma-separated module:function (on PYTHONPATH) or path.py:function, or the
built-ins math_verify, format_regex, answer_number; each is called as
fn(prompts, completions, **columns) -> one float per completion.

The rest is the real-model recipe's (configs/grpo_smollm2.py, read from beside this file, so
this recipe loads from any folder): SmolLM2-135M-Instruct from `python -m grpo_jax.fetch_model
smollm2-135m-instruct` unless model.path says otherwise, 8 prompts x G=8, float32 on CPU
(bfloat16 on GPU/TPU), layers rematerialised, no KL term, AdamW at 2e-5. Completions are up to
64 tokens at temperature 1; held-out evaluation on 100 prompts (or all held-out rows, when
fewer) every 20 steps.
"""

import importlib.util
import os

import ml_collections


def _sibling(name: str):
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
  spec = importlib.util.spec_from_file_location(f"grpo_jax_recipe_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config() -> ml_collections.ConfigDict:
  c = _sibling("grpo_smollm2").get_config()
  c.task.name = "table"
  c.data.update(dict(source="", instruction="", max_prompt_tokens=256, prompt_bucket=32,
                     fit_eval_size=True))  # a small file: evaluate every held-out row
  c.reward.update(dict(name="", format_score=0.0))
  c.rollout.update(dict(max_new_tokens=64, temperature=1.0))
  c.train.update(dict(eval_size=100, eval_batch_size=100))
  return c
