"""The public objective (grpo_jax/rl/objective.py): the loss and gradients the full update
applies, and its value against a NumPy loop reference of the GRPO/PPO formula."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.rl.objective import make_objective
from grpo_jax.train.learner.forward import policy_and_values
from grpo_jax.train.learner.update import make_update_step
from tests.test_update import CFG, _batch_and_state


@pytest.mark.parametrize("case", [
    dict(),  # GRPO: token-mean, k3 KL in the loss; mu = 1, one minibatch (old log-probs reused)
    dict(value_head="shared", advantage="gae", entropy_coef=0.01, kl_coef=0.05,
         loss_aggregation="seq-mean-token-mean", tis_cap=2.0),  # PPO with a critic
    dict(num_iterations=2, dual_clip_c=3.0, clip_eps_high=0.28, kl_coef=0.0),  # old log-probs
])
def test_objective_gives_the_updates_loss_and_gradients(case):
  """One optimizer step of SGD with rate 1 over one minibatch: params - new params is the
  update's gradient. The same gradient and loss from forward + the public objective."""
  rl = rl_defaults(**case)
  if rl.num_iterations > 1:  # one step of the two passes: compare the first
    rl.num_iterations = 1
    rl.reuse_old_logprobs = False
  state, batch, _ = _batch_and_state(rl)
  sgd = optax.sgd(1.0)
  state = state.replace(opt_state=sgd.init((state.params, state.value_params)))
  new_state, metrics = make_update_step(CFG, rl, sgd, 1.0)(state, batch)
  update_grads = jax.tree.map(lambda a, b: a - b, (state.params, state.value_params),
                              (new_state.params, new_state.value_params))

  objective = make_objective(rl)

  def loss(trainable):
    logp, entropy, values, _ = policy_and_values(trainable[0], trainable[1], batch, CFG,
                                              rl.value_head, 1.0)
    old = jax.lax.stop_gradient(logp) if batch.old_logprobs is None else batch.old_logprobs
    is_weights = batch.is_weights
    if rl.tis_cap > 0 and is_weights is None:
      is_weights = jnp.minimum(jnp.exp(old - batch.sampler_logprobs), rl.tis_cap)
    return objective(logp, old, batch.advantages, batch.loss_mask, entropy,
                     kl_coef=state.kl_coef, ref_logp=batch.ref_logprobs,
                     is_weights=is_weights, values=values, old_values=batch.old_values,
                     returns=batch.returns)

  (value, sums), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      (state.params, state.value_params))
  assert float(value) == pytest.approx(float(metrics["loss"]), rel=1e-6, abs=1e-7)
  assert float(sums["pg_loss"]) == pytest.approx(float(metrics["pg_loss"]), rel=1e-6, abs=1e-7)
  largest = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
  assert largest > 1e-3  # a gradient that matters
  for g, u in zip(jax.tree.leaves(grads), jax.tree.leaves(update_grads)):
    # float32 rounding of two compilations of the same maths, and p - (p - g) rounding g to
    # the spacing of p - g: measured up to 1.5e-5 on g = 25.0, 6e-6 where the largest
    # gradient is 25; a wrong term in the objective is off by far more
    np.testing.assert_allclose(np.asarray(g), np.asarray(u), rtol=1e-5, atol=1e-6 * largest)


def _reference_loss(logp, old, ref, adv, mask, entropy, rl, beta):
  """PPO-clip + k3 KL - entropy bonus, token-mean, by loops over rows and tokens."""
  total, count = 0.0, 0
  for b in range(logp.shape[0]):
    for t in range(logp.shape[1]):
      if not mask[b, t]:
        continue
      ratio = np.exp(np.clip(logp[b, t] - old[b, t], -rl.log_ratio_clamp, rl.log_ratio_clamp))
      clipped = np.clip(ratio, 1 - rl.clip_eps_low, 1 + rl.clip_eps_high)
      pg = max(-adv[b, t] * ratio, -adv[b, t] * clipped)
      d = np.clip(ref[b, t] - logp[b, t], -rl.kl_clamp, rl.kl_clamp)
      kl = np.exp(d) - d - 1
      total += pg + beta * kl - rl.entropy_coef * entropy[b, t]
      count += 1
  return total / count


def test_objective_matches_a_loop_reference():
  rng = np.random.default_rng(0)
  shape = (6, 9)
  logp = -rng.exponential(1.0, shape).astype(np.float32)
  old = (logp + rng.normal(0, 0.3, shape)).astype(np.float32)
  ref = (logp + rng.normal(0, 0.5, shape)).astype(np.float32)
  adv = rng.normal(0, 1, shape).astype(np.float32)
  entropy = rng.uniform(0, 3, shape).astype(np.float32)
  mask = rng.uniform(size=shape) < 0.7
  rl = rl_defaults(kl_coef=0.1, entropy_coef=0.02, clip_eps_high=0.28)
  loss, sums = make_objective(rl)(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                                  jnp.asarray(mask), jnp.asarray(entropy),
                                  kl_coef=jnp.float32(0.1), ref_logp=jnp.asarray(ref))
  expected = _reference_loss(logp, old, ref, adv, mask, entropy, rl, 0.1)
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  assert float(sums["tokens"]) == mask.sum()


def test_a_new_loss_is_one_file():
  """A policy loss registered here (no grpo_jax/ edit) is what the objective applies:
  REINFORCE, pg_t = -A_t * pi_t / sg(pi_t), whose gradient in log pi_t is -A_t."""
  from grpo_jax.rl.losses import POLICY_LOSSES  # noqa: PLC0415

  @POLICY_LOSSES.register("reinforce")
  def reinforce(logp, old_logp, advantages, mask):
    ratio = jnp.exp(logp - jax.lax.stop_gradient(logp))
    return -advantages * ratio, {"clipped": jnp.zeros_like(mask), "ratio": ratio}

  try:
    rl = rl_defaults(loss="reinforce", kl_coef=0.0)
    rng = np.random.default_rng(1)
    logp = jnp.asarray(-rng.exponential(1.0, (3, 5)), jnp.float32)
    adv = jnp.asarray(rng.normal(0, 1, (3, 5)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(3, 5)) < 0.8)
    objective = make_objective(rl)
    grad = jax.grad(lambda lp: objective(lp, lp, adv, mask, jnp.zeros_like(lp),
                                         kl_coef=jnp.float32(0.0))[0])(logp)
    want = np.where(np.asarray(mask), -np.asarray(adv), 0.0) / np.asarray(mask).sum()
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6, atol=1e-7)
  finally:
    POLICY_LOSSES.unregister("reinforce")


@pytest.mark.parametrize("loss", ["ppo_clip", "gspo"])
def test_a_negative_log_ratio_clamp_is_one_sentence(loss):
  """rl.log_ratio_clamp < 0 crossed the clip's bounds (a ratio of e^-1 where it is 1): the
  losses that read it refuse it; 0 (off) is kept."""
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  with pytest.raises(ConfigError, match=r"^rl.log_ratio_clamp=-1.0; use 0 \(off\) or a bound "
                                        r"> 0 on \|log pi - log pi_old\| before exp"):
    make_objective(rl_defaults(loss=loss, log_ratio_clamp=-1.0))
  make_objective(rl_defaults(loss=loss, log_ratio_clamp=0.0))
