"""The advantage estimators by config name (rl.advantage): each is one registered function
from `EstimatorInputs` to (advantages (B, N), returns (B, N) or None).

    @register_estimator("my_baseline", groups=True)
    def my_baseline(x: EstimatorInputs):
      seq = x.sequence_rewards()                                   # (B,)
      base = seq.reshape(-1, x.group_size).max(1).repeat(x.group_size)
      return broadcast_to_tokens(seq - base, x.mask), None

`groups=True`: the estimator compares the G completions of a prompt (config validation then
requires G >= 2). `needs`: the names of per-row inputs it reads from `x.extras`, each made by a
registered provider (grpo_jax/rewards/estimator_inputs.py; a new input is a new provider) and
only when an estimator needs it. Built in:
  "greedy_rewards"  (B,)   reward of the greedy completion of each row's prompt (ReMax)
  "step_rewards"    (rewards (B, K), end_index (B, K) int, mask (B, K) bool): process rewards
                           from the task (`Task.step_rewards`) or reward.process_model
`needs_critic=True`: the estimator reads `x.values` (the critic at rollout time).
`shaped=False`: it does not read `x.token_rewards` (where rl.overlong_buffer's penalty and
rl.kl_in="reward"'s KL land), so config validation refuses that shaping with it.
Returns None: the value targets, if a critic is on, are the Monte-Carlo returns.
Keyword-only parameters are hyperparameters: rl fields of the same names, with these defaults,
bound when the estimator is built (`make_estimator`; grpo_jax/registry.py `bind`).
The maths lives in grpo_jax.rl.advantages / token_advantages; this file only wires names.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.registry import Registry
from grpo_jax.rl import advantages as adv_lib
from grpo_jax.rl import token_advantages as tok_adv


class EstimatorInputs(NamedTuple):
  token_rewards: jax.Array  # (B, N) outcome reward on the last token, minus any in-reward KL
  mask: jax.Array  # (B, N) bool, the completion tokens
  values: jax.Array | None  # (B, N) critic values at rollout time; None without a critic
  group_size: int
  extras: dict  # the estimator's `needs`, by name

  def sequence_rewards(self) -> jax.Array:
    """(B,) each completion's total reward (outcome minus any in-reward KL)."""
    return jnp.sum(self.token_rewards, axis=1)


@dataclasses.dataclass(frozen=True)
class Estimator:
  fn: Callable[[EstimatorInputs], tuple]
  groups: bool = False
  needs: tuple[str, ...] = ()
  needs_critic: bool = False
  shaped: bool = True  # reads x.token_rewards, where the reward shaping lands


ESTIMATORS = Registry("rl.advantage")


def register_estimator(name: str, *, groups: bool = False, needs=(), needs_critic=False,
                       shaped: bool = True, replace: bool = False, check=None):
  """Decorator: registers fn(EstimatorInputs, *, hyperparameters) -> (advantages, returns or
  None) as `name`; `needs` names registered estimator inputs (checked when a config selects
  it); check(**hyperparameters) -> None or the sentence saying what is wrong."""

  def add(fn):
    ESTIMATORS.register(name, Estimator(fn, groups, tuple(needs), needs_critic, shaped),
                        replace=replace, check=check)
    return fn
  return add


def make_estimator(rl):
  """estimate(group_size, token_rewards, mask, values, extras=None) -> (advantages (B, N),
  returns (B, N)): the registered estimator rl.advantage with its hyperparameters bound from
  rl here, once. Without returns of its own, the returns are the discounted (Monte-Carlo)
  ones at rl.gamma: a critic next to a critic-free estimator still learns them."""
  fn = ESTIMATORS.bind(rl.advantage, rl, ESTIMATORS.get(rl.advantage).fn)
  gamma = rl.gamma

  def estimate(group_size: int, token_rewards, mask, values, extras=None):
    advantages, returns = fn(EstimatorInputs(token_rewards, mask, values, group_size,
                                             extras or {}))
    if returns is None:
      returns = tok_adv.discounted_returns(token_rewards, mask, gamma)
    return advantages, returns
  return estimate


@register_estimator("grpo", groups=True)
def _grpo(x: EstimatorInputs, *, advantage_eps=1e-6):  # group-std epsilon (verl 1e-6; TRL 1e-4)
  return adv_lib.broadcast_to_tokens(adv_lib.group_normalized_advantages(
      x.sequence_rewards(), x.group_size, advantage_eps, True), x.mask), None


@register_estimator("dr_grpo", groups=True)
def _dr_grpo(x: EstimatorInputs, *, advantage_eps=1e-6):
  return adv_lib.broadcast_to_tokens(adv_lib.group_normalized_advantages(
      x.sequence_rewards(), x.group_size, advantage_eps, False), x.mask), None


@register_estimator("grpo_batch_std", groups=True)
def _grpo_batch_std(x: EstimatorInputs, *, advantage_eps=1e-6):
  return adv_lib.grpo_batch_std_advantages(x.sequence_rewards(), x.group_size, x.mask,
                                           advantage_eps), None


@register_estimator("rloo", groups=True)
def _rloo(x: EstimatorInputs):
  return adv_lib.rloo_advantages(x.sequence_rewards(), x.group_size, x.mask), None


@register_estimator("reinforce_pp")
def _reinforce_pp(x: EstimatorInputs, *, gamma=1.0):
  return tok_adv.reinforce_pp_advantages(x.token_rewards, x.mask, gamma), None


@register_estimator("reinforce_pp_baseline", groups=True)
def _reinforce_pp_baseline(x: EstimatorInputs):
  return adv_lib.reinforce_pp_baseline_advantages(x.sequence_rewards(), x.group_size,
                                                  x.mask), None


@register_estimator("remax", needs=("greedy_rewards",))
def _remax(x: EstimatorInputs):
  return adv_lib.remax_advantages(x.sequence_rewards(), x.extras["greedy_rewards"],
                                  x.mask), None


@register_estimator("process", groups=True, needs=("step_rewards",), shaped=False)
def _process(x: EstimatorInputs, *, advantage_eps=1e-6):
  rewards, end_index, step_mask = x.extras["step_rewards"]
  return tok_adv.process_advantages(rewards, end_index, step_mask, x.group_size, x.mask,
                                    advantage_eps), None


@register_estimator("gae", needs_critic=True)
def _gae(x: EstimatorInputs, *, gamma=1.0, lam=1.0, whiten_advantages=False):
  """gamma and lam: discount and GAE lambda (verl: 1.0, 1.0); whiten over the batch."""
  return tok_adv.gae_advantages(x.token_rewards, x.values, x.mask, gamma, lam,
                                whiten=whiten_advantages)
