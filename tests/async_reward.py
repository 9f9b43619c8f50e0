"""A reward for the asynchronous pipeline's tests (config.imports=tests/async_reward.py,
reward.name=exact_match_after_a_random_wait): the addition task's exact match, after a random
wait of up to GRPO_JAX_TEST_REWARD_DELAY seconds (the wait's randomness is deliberately
unseeded: timing must not change what the run computes)."""

import os
import random
import time

from grpo_jax.rewards.exact_match import exact_match_reward
from grpo_jax.rewards.registry import REWARDS, register_reward


def exact_match_after_a_random_wait(completion_tokens, completion_mask, target_tokens,
                                    target_mask):
  time.sleep(random.uniform(0.0, float(os.environ.get("GRPO_JAX_TEST_REWARD_DELAY", "0"))))
  return exact_match_reward(completion_tokens, completion_mask, target_tokens, target_mask)


if "exact_match_after_a_random_wait" not in REWARDS:
  register_reward("exact_match_after_a_random_wait", kind="tokens")(
      exact_match_after_a_random_wait)
