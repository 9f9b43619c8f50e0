"""prepare_from_logprobs (train/learner/experience.py), the preparation between a rollout and
the update as a function of arrays alone, against an independent NumPy reference: GRPO with the
KL (k1) as a per-token penalty in the reward, DAPO's overlong shaping and truncated rows
masked out. No model is called: the log-probs, rewards and masks are made up."""

import jax.numpy as jnp
import numpy as np

from grpo_jax.defaults import rl_defaults
from grpo_jax.rollout.types import Rollout
from grpo_jax.train.learner.experience import RewardInputs, prepare_from_logprobs

G, B, N, MAX_NEW, BUFFER, BETA = 4, 8, 6, 6, 3, 0.1


def test_grpo_with_kl_in_reward_and_overlong_shaping_equals_numpy():
  rng = np.random.default_rng(0)
  lengths = np.array([2, 6, 4, 5, 3, 6, 1, 4])
  mask = np.arange(N)[None, :] < lengths[:, None]
  truncated = lengths == N
  actions = mask & (rng.random((B, N)) > 0.2)  # a few inserted (non-policy) tokens
  old, ref, sampler = (np.where(mask, -rng.random((B, N)) * 3, 0.0).astype(np.float32)
                       for _ in range(3))
  rewards = rng.integers(0, 2, B).astype(np.float32)
  rl = rl_defaults(kl_in="reward", kl_coef=BETA, kl_estimator="k1", overlong_buffer=BUFFER,
                   overlong_penalty=1.0, mask_truncated=True)
  rollout = Rollout(jnp.ones((B, 2), jnp.int32), jnp.ones((B, 2), bool),
                    jnp.zeros((B, N), jnp.int32), jnp.asarray(mask), jnp.asarray(sampler),
                    jnp.asarray(truncated), jnp.asarray(actions))
  batch, metrics = prepare_from_logprobs(
      rl, G, MAX_NEW, rollout, RewardInputs(jnp.asarray(rewards), {}, jnp.int32(B // G)),
      old_logp=jnp.asarray(old), ref_logp=jnp.asarray(ref), old_values=None,
      kl_coef=jnp.float32(BETA))

  # The reference, written out: DAPO's penalty over the last BUFFER tokens of the budget,
  # the k1 KL over the policy's tokens (actions) summed into each completion's reward, GRPO's
  # group normalisation (n - 1 std).
  over = np.where(lengths <= MAX_NEW - BUFFER, 0.0,
                  ((MAX_NEW - BUFFER) - lengths) / BUFFER * 1.0)
  shaped = rewards + over
  sequence = shaped - BETA * np.sum(np.where(actions, old - ref, 0.0), axis=1)
  groups = sequence.reshape(-1, G)
  adv = ((groups - groups.mean(1, keepdims=True)) /
         (groups.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
  np.testing.assert_allclose(batch.advantages, np.where(mask, adv[:, None], 0.0), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_array_equal(batch.loss_mask, actions & ~truncated[:, None])
  np.testing.assert_array_equal(batch.sampler_logprobs, sampler)
  np.testing.assert_array_equal(batch.outcome_rewards, rewards)
  assert batch.returns is None and batch.is_weights is None
  np.testing.assert_allclose(metrics["shaped_reward_mean"], shaped.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["rollout_kl"], np.sum(np.where(actions, old - ref, 0)) /
                             actions.sum(), rtol=1e-5)
