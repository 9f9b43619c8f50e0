"""Off-policy corrections (grpo_jax/rl/corrections.py) against NumPy transcriptions of the
published formulas and, where verl's source is at hand, against verl's own functions.

* truncated / masked IS at token and sequence level: verl's rollout correction
  (verl/trainer/ppo/rollout_corr_helper.py, compute_rollout_correction_weights; IcePop = a
  "lower_upper" threshold);
* CISPO: MiniMax-M1 (arXiv 2506.13585) section 3.1, eqs. (4)-(5), with its gradient, and verl's
  core_algos.compute_policy_loss_cispo;
* decoupled PPO: AReaL (arXiv 2505.24298) eq. (5), through make_objective, with its gradient.

verl parity runs when GRPO_JAX_VERL_SRC names a folder holding verl's package (e.g. the
unpacked wheel: `pip download verl==0.9.1 --no-deps`, unzip); only the two module files are
loaded, their unused imports stubbed. Without it those tests skip (CI has no verl).
"""

import importlib.util
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ConfigError, validate
from grpo_jax.defaults import get_defaults, rl_defaults
from grpo_jax.rl.corrections import (IS_CORRECTIONS, correction_metrics,
                                     make_correction)
from grpo_jax.rl.losses import truncated_is_weights
from grpo_jax.rl.objective import make_objective

B, N = 6, 7
f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  prox = np.log(rng.uniform(0.05, 0.95, (B, N)))
  behav = prox + rng.normal(0.0, 0.5, (B, N))  # ratios well inside and outside [0.5, 2]
  logp = prox + rng.normal(0.0, 0.2, (B, N))
  adv = np.repeat(np.array([-1.0, -0.5, 0.7, -1.2, 0.3, 1.0])[:, None], N, 1)
  lengths = np.array([7, 5, 1, 3, 2, 6])
  mask = np.arange(N)[None, :] < lengths[:, None]
  return [x.astype(np.float32) for x in (behav, prox, logp, adv)] + [mask]


def _numpy_weights(name, behav, prox, mask, low, high):
  """The modules' table, transcribed: rho_t = pi_prox / mu per token, R_i its product."""
  rho = np.exp(np.clip(prox - behav, -20, 20))
  seq = np.exp(np.clip(np.where(mask, prox - behav, 0).sum(1, keepdims=True), -20, 20))
  seq = np.broadcast_to(seq, mask.shape)
  w = {"tis_token": np.minimum(rho, high), "tis_sequence": np.minimum(seq, high),
       "mis_token": np.where((rho >= low) & (rho <= high), rho, 0),
       "mis_sequence": np.where((seq >= low) & (seq <= high), seq, 0),
       "decoupled_ppo": np.where(rho <= 1.2, rho, 0)}[name]  # decoupled_cap 1.2
  return np.where(mask, w, 0.0)


@pytest.mark.parametrize("name", ["tis_token", "tis_sequence", "mis_token", "mis_sequence",
                                  "decoupled_ppo"])
def test_each_correction_is_its_formula_and_carries_no_gradient(name):
  behav, prox, _, _, mask = _inputs()
  rl = rl_defaults(is_correction=name, is_low=0.5, is_high=2.0, decoupled_cap=1.2)
  weights, sums = make_correction(rl)(f32(behav), f32(prox), mask)
  want = _numpy_weights(name, behav, prox, mask, 0.5, 2.0)
  np.testing.assert_allclose(np.asarray(weights), want, rtol=1e-6, atol=1e-6)
  if name.startswith("mis") or name == "decoupled_ppo":  # some masked, not all
    assert 0 < (want[mask] == 0).sum() < mask.sum()
  g = jax.grad(lambda p: jnp.sum(make_correction(rl)(f32(behav), p, mask)[0]))(f32(prox))
  assert not np.any(np.asarray(g))
  # the metrics: ratio mean / max / min over the tokens, masked fraction, k3 KL(mu || pi_prox)
  m = correction_metrics(sums)
  rho = np.exp(prox - behav)[mask]
  np.testing.assert_allclose(float(m["is_ratio"]), rho.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(m["is_ratio_max"]), rho.max(), rtol=1e-6)
  np.testing.assert_allclose(float(m["is_ratio_min"]), rho.min(), rtol=1e-6)
  np.testing.assert_allclose(float(m["is_weight"]), want[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(m["is_masked_frac"]), (want[mask] == 0).mean(), rtol=1e-6)
  np.testing.assert_allclose(float(m["behaviour_kl"]), (rho - 1 - np.log(rho)).mean(),
                             rtol=1e-5)


def test_staleness_passes_through_and_none_is_no_correction():
  behav, prox, _, _, mask = _inputs(1)
  rl = rl_defaults(is_correction="tis_token")
  _, sums = make_correction(rl)(f32(behav), f32(prox), mask, staleness=np.array([0, 1, 2, 0,
                                                                               3, 1]))
  m = correction_metrics(sums)
  assert float(m["staleness_mean"]) == pytest.approx(7 / 6) and float(m["staleness_max"]) == 3
  assert make_correction(rl_defaults()) is None  # the default: today's behaviour
  # "tis_token" gives rl.tis_cap's weights (losses.truncated_is_weights)
  w, _ = make_correction(rl_defaults(is_correction="tis_token", is_high=1.5))(
      f32(behav), f32(prox), mask)
  np.testing.assert_array_equal(np.asarray(w), np.asarray(truncated_is_weights(
      f32(prox), f32(behav), mask, 1.5)))


def test_cispo_is_minimax_m1_eqs_4_5_with_its_gradient():
  """J = 1/sum|o_i| sum_{i,t} sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi (eqs. (4)-(5)),
  through make_objective with token-mean aggregation: d(-J)/dlogp = -r^ A / tokens."""
  _, old, logp, adv, mask = _inputs(2)
  lo, hi = 0.1, 0.2
  rl = rl_defaults(loss="cispo", cispo_eps_low=lo, cispo_eps_high=hi, kl_coef=0.0)
  objective = make_objective(rl)
  f = lambda lp: objective(lp, f32(old), f32(adv), mask, f32(np.zeros((B, N))),  # noqa: E731
                           kl_coef=jnp.float32(0.0))
  loss, sums = f(f32(logp))
  r_hat = np.clip(np.exp(logp - old), 1 - lo, 1 + hi)
  want = -(r_hat * adv * logp)[mask].sum() / mask.sum()
  np.testing.assert_allclose(float(loss), want, rtol=1e-6)
  grad = jax.grad(lambda lp: f(lp)[0])(f32(logp))
  np.testing.assert_allclose(np.asarray(grad), np.where(mask, -r_hat * adv / mask.sum(), 0),
                             rtol=1e-5, atol=1e-7)
  clipped = (r_hat != np.exp(logp - old))[mask].sum()
  assert 0 < clipped < mask.sum() and float(sums["clip_frac"]) == clipped


def test_decoupled_ppo_is_areal_eq_5_with_its_gradient():
  """J = E[pi_prox / mu * min(u A, clip(u, 1 - eps, 1 + eps) A)], u = pi / pi_prox (AReaL eq.
  (5)); the loss -J as a token mean, its gradient through u alone."""
  behav, prox, logp, adv, mask = _inputs(3)
  eps_lo, eps_hi = 0.2, 0.28
  rl = rl_defaults(is_correction="decoupled_ppo", clip_eps_low=eps_lo, clip_eps_high=eps_hi,
                   kl_coef=0.0)
  weights, _ = make_correction(rl)(f32(behav), f32(prox), mask)
  objective = make_objective(rl)
  f = lambda lp: objective(lp, f32(prox), f32(adv), mask, f32(np.zeros((B, N))),  # noqa: E731
                           kl_coef=jnp.float32(0.0), is_weights=weights)[0]
  behaviour_weight = np.exp(prox - behav)
  u = np.exp(logp - prox)
  surrogate = np.minimum(u * adv, np.clip(u, 1 - eps_lo, 1 + eps_hi) * adv)
  want = -(behaviour_weight * surrogate)[mask].sum() / mask.sum()
  np.testing.assert_allclose(float(f(f32(logp))), want, rtol=1e-6)
  unclipped = (u * adv <= np.clip(u, 1 - eps_lo, 1 + eps_hi) * adv)
  want_grad = np.where(mask & unclipped, -behaviour_weight * u * adv / mask.sum(), 0)
  np.testing.assert_allclose(np.asarray(jax.grad(f)(f32(logp))), want_grad, rtol=1e-5,
                             atol=1e-7)


@pytest.mark.parametrize("field,value,needle", [
    ("is_high", -1.0, r"rl.is_high=-1.0; the importance-weight cap must be positive"),
    ("is_low", 3.0, r"rl.is_low=3.0, rl.is_high=2.0; the masked modes"),
    ("decoupled_cap", 0.5, r"rl.decoupled_cap=0.5; use 0 \(no cap\) or a cap > 1"),
    ("tis_cap", 2.0, r"rl.tis_cap=2.0 and rl.is_correction=.* both weight the loss"),
    ("objective", "drpo", r"rl.objective='drpo' has no value loss, importance weights"),
])
def test_bad_settings_are_one_sentence(field, value, needle):
  config = get_defaults()
  config.rl.is_correction = {"is_low": "mis_token", "decoupled_cap": "decoupled_ppo"}.get(
      field, "tis_token")
  config.rl[field] = value
  with pytest.raises(ConfigError, match=needle):
    validate(config)


def test_an_unknown_correction_names_the_valid_ones():
  config = get_defaults()
  config.rl.is_correction = "icepop"
  with pytest.raises(ConfigError, match="rl.is_correction='icepop' is unknown; valid: "
                                        "decoupled_ppo, mis_geometric, mis_sequence"):
    validate(config)
  assert "tis_token" in IS_CORRECTIONS


# -- verl's own code --------------------------------------------------------------------------

def _stub(name, **attrs):
  module = types.ModuleType(name)
  module.__path__ = []  # a package, so that submodules can be registered under it
  module.__dict__.update(attrs)
  return module


@pytest.fixture(scope="module")
def verl():
  """verl's rollout_corr_helper and core_algos, loaded from GRPO_JAX_VERL_SRC with stubs for
  the imports these functions do not use."""
  src = os.environ.get("GRPO_JAX_VERL_SRC", "")
  if not os.path.isfile(os.path.join(src, "verl", "trainer", "ppo", "rollout_corr_helper.py")):
    pytest.skip("verl's source not found: set GRPO_JAX_VERL_SRC to a folder holding verl/ "
                "(e.g. the unpacked verl 0.9.1 wheel).")
  torch = pytest.importorskip("torch")

  class ActorConfig:  # what compute_policy_loss_cispo reads
    clip_ratio = 0.2
    global_batch_info = {}

  identity = lambda *a, **k: (lambda f: f)  # noqa: E731
  stubs = {
      "verl": _stub("verl"), "verl.utils": _stub("verl.utils", as_torch_index=None,
                                                 group_mean_std=None),
      "verl.utils.device": _stub("verl.utils.device", get_device_name=lambda: "cpu",
                                 get_torch_device=lambda: torch.cpu),
      "verl.utils.import_utils": _stub("verl.utils.import_utils", deprecated=identity),
      "verl.protocol": _stub("verl.protocol", DataProto=None),
      "verl.trainer": _stub("verl.trainer"),
      "verl.trainer.config": _stub("verl.trainer.config", AlgoConfig=object),
      "verl.trainer.config.algorithm": _stub("verl.trainer.config.algorithm",
                                             RolloutCorrectionConfig=object),
      "verl.trainer.ppo": _stub("verl.trainer.ppo"),
      "verl.workers": _stub("verl.workers"),
      "verl.workers.config": _stub("verl.workers.config", ActorConfig=ActorConfig),
      "verl.workers.config.actor": _stub("verl.workers.config.actor", PolicyLossConfig=object),
      "tensordict": _stub("tensordict", TensorDict=object),
      "omegaconf": _stub("omegaconf", DictConfig=object),
      "transformers": _stub("transformers", PreTrainedTokenizer=object),
  }
  loaded = {}
  with pytest.MonkeyPatch.context() as mp:
    for name, module in stubs.items():
      mp.setitem(sys.modules, name, module)
    for name, rel in (("verl.utils.torch_functional", "utils/torch_functional.py"),
                      ("verl.trainer.ppo.rollout_corr_helper", "trainer/ppo/rollout_corr_helper.py"),
                      ("verl.trainer.ppo.core_algos", "trainer/ppo/core_algos.py")):
      spec = importlib.util.spec_from_file_location(name, os.path.join(src, "verl", rel))
      module = importlib.util.module_from_spec(spec)
      mp.setitem(sys.modules, name, module)
      spec.loader.exec_module(module)
      loaded[rel.split("/")[-1][:-3]] = module
  return types.SimpleNamespace(torch=torch, ActorConfig=ActorConfig, **loaded)


@pytest.mark.parametrize("name,level,threshold", [
    ("tis_token", "token", 2.0), ("tis_sequence", "sequence", 2.0),
    ("mis_token", "token", "0.5_2.0"), ("mis_sequence", "sequence", "0.5_2.0")])
def test_rollout_is_matches_verls_compute_rollout_correction_weights(verl, name, level,
                                                                     threshold):
  torch = verl.torch
  worst = 0.0
  for seed in range(4):
    behav, prox, _, _, mask = _inputs(seed)
    want, _ = verl.rollout_corr_helper.compute_rollout_correction_weights(
        torch.tensor(prox - behav, dtype=torch.float32), torch.tensor(mask, dtype=torch.float32),
        rollout_is=level, rollout_is_threshold=threshold)
    got, _ = make_correction(rl_defaults(is_correction=name, is_low=0.5, is_high=2.0))(
        f32(behav), f32(prox), mask)
    worst = max(worst, float(np.max(np.abs(np.asarray(got) - want.numpy()))))
  assert worst <= 1e-6, worst


def test_cispo_matches_verls_compute_policy_loss_cispo(verl):
  torch = verl.torch
  _, old, logp, adv, mask = _inputs(4)
  config = verl.ActorConfig()
  config.clip_ratio_low, config.clip_ratio_high = 10.0, 0.2
  log_prob = torch.tensor(logp, requires_grad=True)
  want, _ = verl.core_algos.compute_policy_loss_cispo(
      torch.tensor(old), log_prob, torch.tensor(adv), torch.tensor(mask, dtype=torch.float32),
      loss_agg_mode="token-mean", config=config)
  want.backward()
  objective = make_objective(rl_defaults(loss="cispo", cispo_eps_low=10.0, cispo_eps_high=0.2,
                                         kl_coef=0.0))
  f = lambda lp: objective(lp, f32(old), f32(adv), mask, f32(np.zeros((B, N))),  # noqa: E731
                           kl_coef=jnp.float32(0.0))[0]
  assert abs(float(f(f32(logp))) - want.item()) <= 1e-6
  grad = np.asarray(jax.grad(f)(f32(logp)))
  assert np.max(np.abs(grad - log_prob.grad.numpy())) <= 1e-6


def test_cispo_refuses_a_negative_log_ratio_clamp():
  """A negative rl.log_ratio_clamp crossed the clip's bounds (CISPO's weights e^-c where the
  policies agree); 0 (off) is kept."""
  with pytest.raises(ConfigError, match=r"^rl.log_ratio_clamp=-1.0; use 0 \(off\)"):
    make_objective(rl_defaults(loss="cispo", log_ratio_clamp=-1.0))
  make_objective(rl_defaults(loss="cispo", log_ratio_clamp=0.0))
