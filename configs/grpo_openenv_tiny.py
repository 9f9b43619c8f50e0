"""GRPO on an OpenEnv environment through the adapter (env.name="openenv",
grpo_jax/envs/adapters/openenv.py): a number-guessing game written with OpenEnv's public API
(grpo_jax/envs/adapters/openenv_guess.py), played in this process, with a tiny random model
and the character tokenizer on a CPU. Needs `pip install 'grpo_jax[openenv]'`.

    python -m grpo_jax.main --config=configs/grpo_openenv_tiny.py --workdir=/tmp/openenv

An episode: the user (the OpenEnv observation) says "Guess 0-9"; each assistant turn is sent
as the game's `GuessAction(message=...)`, the reply ("higher", "lower", "Reply with a
digit.") comes back as a user message, and "correct" ends the episode with the rubric's reward
1. At most 3 turns. No warm-up: it shows the plumbing runs end to end, not that it learns.
"""

import ml_collections

from grpo_jax.defaults import get_defaults


def get_config() -> ml_collections.ConfigDict:
  c = get_defaults()
  c.task.name = "env"
  c.task.tokenizer = "char"
  c.task.prompt_width = 48
  c.task.test_size = 16
  c.env.name = "openenv"
  c.env.environment = "grpo_jax.envs.adapters.openenv_guess:GuessNumberEnvironment"
  c.env.action_field = "message"  # GuessAction's field that takes the assistant's text
  c.env.max_turns = 3
  c.env.max_completion_tokens = 160  # 3 turns of 8 ids and the replies
  c.model.vocab_size = 128
  c.model.hidden_size, c.model.head_dim, c.model.intermediate_size = 64, 16, 192
  c.model.num_layers = 2
  c.train.experience_source = "episodes"
  c.rollout.num_prompts = 4
  c.rollout.group_size = 4
  c.rollout.max_new_tokens = 8  # one turn
  c.rollout.temperature = 1.0
  c.warmup.steps = 0
  c.rl.kl_coef = 0.0
  c.optim.learning_rate = 1e-3
  c.train.steps = 10
  c.train.eval_every = 5
  c.train.eval_size = 16
  c.train.eval_batch_size = 16
  c.train.checkpoint_every = 5
  c.train.num_samples = 2
  return c
