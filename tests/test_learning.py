"""GRPO learns: the real sampler and the run's own RL step (grpo_jax/train/learner/step.py, jitted with
the state donated as the loop does) raise a reward within seconds."""

import functools

import jax
import ml_collections
import numpy as np

from grpo_jax.defaults import rl_defaults
from grpo_jax.models.decoder import init_params
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.learner.state import create_train_state, make_optimizer, step_key
from grpo_jax.train.learner.step import StepSpec, make_rl_step
from tests.fixtures import tiny_model_config

TARGET = 7  # reward: the fraction of generated tokens that are TARGET


def test_grpo_raises_reward_on_a_toy_task():
  cfg = tiny_model_config(vocab_size=16)
  rl = rl_defaults(kl_coef=0.01, num_iterations=2, num_minibatches=2)
  optim = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=2, weight_decay=0.0,
                                         b1=0.9, b2=0.99, max_grad_norm=1.0))
  optimizer = make_optimizer(optim, 100)
  state = create_train_state(init_params(cfg, jax.random.key(0)), optimizer, jax.random.key(1),
                             kl_coef=rl.kl_coef)
  group, prompts = 8, np.array([[1, 5, 6], [1, 9, 4], [0, 1, 3], [1, 12, 11]], np.int32)
  prompts = np.repeat(prompts, group, 0)
  sample = functools.partial(generate, model_cfg=cfg, max_new_tokens=4, temperature=1.0,
                             eos_id=2, pad_id=0)
  rl_step = jax.jit(make_rl_step(StepSpec(cfg, rl, optimizer, group, 1.0, 4)),
                    donate_argnums=0)
  rewards = []
  for _ in range(25):
    rollout = sample(state.params, prompts, prompts != 0, step_key(state, 0))
    mask = np.asarray(rollout.completion_mask)
    reward = ((np.asarray(rollout.completion_tokens) == TARGET) & mask).sum(1) / mask.sum(1)
    rewards.append(reward.mean())
    state, metrics = rl_step(state, rollout, RewardInputs(reward.astype(np.float32), {},
                                                          np.int32(4)))
    assert np.isfinite(float(metrics["loss"]))
  assert np.mean(rewards[:3]) < 0.2
  assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.4, rewards
  assert int(state.step) == 25 and int(state.skipped_updates) == 0
