"""verl's rejection sampling (rl.is_correction "rs_*", grpo_jax/rl/rejection.py), its
composition with an importance weight ("+"), rl.is_batch_normalize, the geometric-mean weights
and the veto of verl 0.6, and every correction on a rollout sampled by an older policy with the
old log-probs recomputed.

Each against a NumPy transcription of the docstrings' formulas and, where verl's source is at
hand, against verl's own functions (<= 1e-6): GRPO_JAX_VERL_SRC (see tests/test_corrections.py)
for 0.9.1's compute_rollout_rejection_mask and compute_rollout_correction_weights,
GRPO_JAX_VERL06_SRC (the unpacked verl 0.6.0 wheel) for 0.6's
compute_rollout_importance_weights. Without them those tests skip.
"""

import importlib.util
import math
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import ConfigError, validate
from grpo_jax.defaults import get_defaults, rl_defaults
from grpo_jax.rl.corrections import IS_CORRECTIONS, correction_metrics, make_correction
from grpo_jax.rl.rejection import REJECTION_OPTIONS
from tests.test_corrections import _stub, verl  # noqa: F401  the fixture loading verl's code

B, N = 8, 9
f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
K1_BOUNDS = (0.6, 1.8)  # asymmetric, so that the direction of k1's bounds is pinned down
KL_MAX = 0.02


def _inputs(seed=0):
  """Rows from nearly on-policy (noise 0.01) to far off it (1.0), so that every mode keeps
  some rows and rejects others."""
  rng = np.random.default_rng(seed)
  prox = np.log(rng.uniform(0.05, 0.95, (B, N)))
  scale = np.array([0.01, 0.03, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0])[rng.permutation(B), None]
  behav = prox + rng.normal(0.0, 1.0, (B, N)) * scale + rng.normal(0, 0.5, (B, 1)) * scale
  lengths = rng.integers(1, N + 1, B)
  lengths[0] = 0  # a row without tokens
  mask = np.arange(N)[None, :] < lengths[:, None]
  return behav.astype(np.float32), prox.astype(np.float32), mask


def _numpy_rejection(option, behav, prox, mask, low, high, kl_max):
  """The module docstring, transcribed: keep (B, N) as 0/1."""
  level, k = option.rsplit("_", 1)
  d = np.clip(np.where(mask, prox - behav, 0.0).astype(np.float64), -20, 20)
  per_token = {"k1": -d, "k2": d * d / 2, "k3": np.exp(d) - 1 - d}[k]
  count = mask.sum(1, keepdims=True)
  total = np.where(mask, per_token, 0).sum(1, keepdims=True)
  top = np.where(mask, per_token, -np.inf).max(1, keepdims=True)
  stat = {"token": per_token, "seq_sum": total, "seq_mean": total / np.maximum(count, 1),
          "seq_max": np.where(np.isinf(top), 0.0, top)}[level]
  stat = np.broadcast_to(stat, mask.shape)
  keep = ((stat >= math.log(low)) & (stat <= math.log(high))) if k == "k1" else stat <= kl_max
  return (keep & mask).astype(np.float64)


def _rl(name, **overrides):
  return rl_defaults(is_correction=name, rs_low=K1_BOUNDS[0], rs_high=K1_BOUNDS[1],
                     rs_kl_max=KL_MAX, **overrides)


@pytest.mark.parametrize("option", REJECTION_OPTIONS)
def test_each_rejection_is_its_formula_with_its_metrics(option):
  behav, prox, mask = _inputs()
  weights, sums = make_correction(_rl(f"rs_{option}"))(f32(behav), f32(prox), mask)
  want = _numpy_rejection(option, behav, prox, mask, *K1_BOUNDS, KL_MAX)
  np.testing.assert_array_equal(np.asarray(weights), want)
  assert 0 < want[mask].sum() < mask.sum(), "the inputs keep some tokens and reject others"
  m = correction_metrics(sums)
  np.testing.assert_allclose(float(m["is_masked_frac"]), 1 - want[mask].mean(), rtol=1e-6)
  np.testing.assert_allclose(float(m["is_weight"]), want[mask].mean(), rtol=1e-6)
  g = jax.grad(lambda p: jnp.sum(make_correction(_rl(f"rs_{option}"))(
      f32(behav), p, mask)[0]))(f32(prox))
  assert not np.any(np.asarray(g))


def test_k1_bounds_apply_to_mu_over_pi_prox_and_default_to_reciprocals():
  """A token with pi_prox / mu = 1.7 (mu / pi_prox = 0.59) is rejected by bounds [0.6, 1.8] on
  mu / pi_prox; rs_low = 0 makes them [1 / rs_high, rs_high], which keeps it."""
  prox = np.log(np.full((1, 2), 0.5, np.float32))
  behav = prox - np.log(np.array([[1.7, 1.0]], np.float32))
  w, _ = make_correction(_rl("rs_token_k1"))(f32(behav), f32(prox), np.ones((1, 2), bool))
  np.testing.assert_array_equal(np.asarray(w), [[0.0, 1.0]])
  w, _ = make_correction(rl_defaults(is_correction="rs_token_k1", rs_high=1.8))(
      f32(behav), f32(prox), np.ones((1, 2), bool))
  np.testing.assert_array_equal(np.asarray(w), [[1.0, 1.0]])


def test_a_weight_joined_to_rejections_is_their_product():
  behav, prox, mask = _inputs(1)
  name = "tis_sequence+rs_seq_mean_k1+rs_token_k3"
  got, _ = make_correction(_rl(name))(f32(behav), f32(prox), mask)
  want = np.ones(mask.shape)
  for part in name.split("+"):
    want = want * np.asarray(make_correction(_rl(part))(f32(behav), f32(prox), mask)[0])
  np.testing.assert_array_equal(np.asarray(got), want)
  assert 0 < (want[mask] > 0).sum() < mask.sum()


def _numpy_batch_normalized(name, behav, prox, mask, low, high):
  rho = np.exp(np.clip(prox - behav, -20, 20))
  seq = np.broadcast_to(np.exp(np.clip(np.where(mask, prox - behav, 0).sum(1, keepdims=True),
                                       -20, 20)), mask.shape)
  ratio = seq if name.endswith("sequence") else rho
  w = np.minimum(ratio, high) if name.startswith("tis") else np.where(
      (ratio >= low) & (ratio <= high), ratio, 0)
  w = np.where(mask, w, 0.0)
  if name.endswith("sequence"):  # the mean over rows with tokens of each row's weight
    rows = mask.any(1)
    mean = w.max(1)[rows].mean()
  else:
    mean = w[mask].mean()
  return w / mean


@pytest.mark.parametrize("name", ["tis_token", "tis_sequence", "mis_token", "mis_sequence"])
def test_batch_normalized_weights_have_mean_one(name):
  behav, prox, mask = _inputs(2)
  rl = rl_defaults(is_correction=name, is_low=0.5, is_high=2.0, is_batch_normalize=True)
  got, _ = make_correction(rl)(f32(behav), f32(prox), mask)
  want = _numpy_batch_normalized(name, behav, prox, mask, 0.5, 2.0)
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6, atol=1e-7)


def test_geometric_weights_and_the_veto_are_their_formulas():
  behav, prox, mask = _inputs(3)
  d = np.where(mask, prox - behav, 0.0).astype(np.float64)
  geo = np.exp(np.clip(d.sum(1, keepdims=True) / np.maximum(mask.sum(1, keepdims=True), 1),
                       -20, 20))
  geo = np.where(mask, geo, 0.0)
  want = {"tis_geometric": np.minimum(geo, 1.05),
          "mis_geometric": np.where((geo >= 0.95) & (geo <= 1.05), geo, 0.0),
          "rs_veto": np.where(mask & ~(mask & (d < math.log(0.3))).any(1, keepdims=True),
                              1.0, 0.0)}
  for name, w in want.items():
    rl = rl_defaults(is_correction=name, is_low=0.95, is_high=1.05, rs_veto_threshold=0.3)
    got, _ = make_correction(rl)(f32(behav), f32(prox), mask)
    np.testing.assert_allclose(np.asarray(got), w, rtol=1e-6, atol=1e-7, err_msg=name)
    if name != "tis_geometric":
      assert 0 < (w[mask] == 0).sum() < mask.sum(), name


@pytest.mark.parametrize("overrides,needle", [
    (dict(is_correction="tis_token+mis_token"), r"joins entries that do not compose"),
    (dict(is_correction="rs_token_k1+rs_token_k1"), r"joins entries that do not compose"),
    (dict(is_correction="none+rs_token_k1"), r"joins entries that do not compose"),
    (dict(is_correction="tis_token+rs_token_k4"), r"rl.is_correction='rs_token_k4' is unknown"),
    (dict(is_correction="rs_seq_mean_k1", rs_high=0.5), r"rl.rs_low=0.0, rl.rs_high=0.5; the k1"),
    (dict(is_correction="rs_token_k1", rs_low=3.0), r"rl.rs_low=3.0, rl.rs_high=2.0; the k1"),
    (dict(is_correction="rs_seq_max_k3", rs_kl_max=0.0), r"rl.rs_kl_max=0.0; the k2/k3"),
    (dict(is_correction="rs_veto", rs_veto_threshold=2.0), r"rl.rs_veto_threshold=2.0; rs_veto"),
    (dict(is_correction="rs_token_k2", is_batch_normalize=True),
     r"rl.is_batch_normalize=True normalises the tis_\* / mis_\* weights"),
    (dict(is_correction="tis_token", is_batch_normalize=True, num_micro_batches=2),
     r"rl.is_batch_normalize normalises over the rows one computation sees"),
])
def test_bad_settings_are_one_sentence(overrides, needle):
  from grpo_jax.train.stages import rl as _registers_sources  # noqa: F401,PLC0415
  from grpo_jax.train.stages.rl_checks import check_source  # noqa: PLC0415

  def check(config):  # the config's validation, then the RL stage's checks of its source
    validate(config)
    check_source(config.train, config.rl)
  config = get_defaults()
  config.rl.update(overrides)
  with pytest.raises(ConfigError, match=needle):
    check(config)
  if "num_micro_batches" in overrides:  # the whole batch's mean: fine
    config.rl.reuse_old_logprobs = False
    check(config)


# -- verl's own code --------------------------------------------------------------------------

@pytest.mark.parametrize("option", REJECTION_OPTIONS)
def test_rejection_matches_verls_compute_rollout_rejection_mask(verl, option):  # noqa: F811
  torch = verl.torch
  threshold = "{}_{}".format(*K1_BOUNDS) if option.endswith("k1") else KL_MAX
  for seed in range(4):
    behav, prox, mask = _inputs(seed)
    want, _ = verl.rollout_corr_helper.compute_rollout_rejection_mask(
        torch.tensor(prox - behav), torch.tensor(mask, dtype=torch.float32),
        rollout_rs=option, rollout_rs_threshold=threshold)
    got, _ = make_correction(_rl(f"rs_{option}"))(f32(behav), f32(prox), mask)
    np.testing.assert_array_equal(np.asarray(got), want.numpy(), err_msg=f"seed {seed}")


def test_chained_rejection_and_a_single_k1_threshold_match_verl(verl):  # noqa: F811
  """verl's "token_k1,seq_mean_k3" (both must pass) is "rs_token_k1+rs_seq_mean_k3"; its
  single k1 threshold 1.8 means [1/1.8, 1.8], rs_low = 0."""
  torch = verl.torch
  for seed in range(4):
    behav, prox, mask = _inputs(seed)
    want, _ = verl.rollout_corr_helper.compute_rollout_rejection_mask(
        torch.tensor(prox - behav), torch.tensor(mask, dtype=torch.float32),
        rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold=f"1.8,{KL_MAX}")
    rl = rl_defaults(is_correction="rs_token_k1+rs_seq_mean_k3", rs_high=1.8, rs_kl_max=KL_MAX)
    got, _ = make_correction(rl)(f32(behav), f32(prox), mask)
    np.testing.assert_array_equal(np.asarray(got), want.numpy(), err_msg=f"seed {seed}")


@pytest.mark.parametrize("name,level,threshold", [
    ("tis_token", "token", 2.0), ("tis_sequence", "sequence", 2.0),
    ("mis_token", "token", "0.5_2.0"), ("mis_sequence", "sequence", "0.5_2.0")])
def test_batch_normalize_and_is_with_rs_match_verl(verl, name, level, threshold):  # noqa: F811
  """rollout_is_batch_normalize=True, then a preset's IS weights times its rejection mask
  (verl's decoupled_geo_rs_*_tis with bounds that bite on these inputs)."""
  torch = verl.torch
  worst = 0.0
  for seed in range(4):
    behav, prox, mask = _inputs(seed)
    log_ratio, m = torch.tensor(prox - behav), torch.tensor(mask, dtype=torch.float32)
    weights, _ = verl.rollout_corr_helper.compute_rollout_correction_weights(
        log_ratio, m, rollout_is=level, rollout_is_threshold=threshold,
        rollout_is_batch_normalize=True)
    keep, _ = verl.rollout_corr_helper.compute_rollout_rejection_mask(
        log_ratio, m, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1.1")
    rl = rl_defaults(is_correction=f"{name}+rs_seq_mean_k1", is_low=0.5, is_high=2.0,
                     is_batch_normalize=True, rs_low=0.9, rs_high=1.1)
    got, _ = make_correction(rl)(f32(behav), f32(prox), mask)
    worst = max(worst, float(np.max(np.abs(np.asarray(got) - (weights * keep).numpy()))))
  assert worst <= 1e-6, worst


@pytest.fixture(scope="module")
def verl06():
  """verl 0.6.0's mismatch_helper (its rollout IS with the "geometric" level and the veto),
  loaded from GRPO_JAX_VERL06_SRC with stubs for the imports it does not use."""
  src = os.environ.get("GRPO_JAX_VERL06_SRC", "")
  if not os.path.isfile(os.path.join(src, "verl", "trainer", "ppo", "mismatch_helper.py")):
    pytest.skip("verl 0.6's source not found: set GRPO_JAX_VERL06_SRC to a folder holding "
                "verl/ (the unpacked verl 0.6.0 wheel).")
  torch = pytest.importorskip("torch")
  class DataProto:  # what the function returns its weights in
    def __init__(self, tensors):
      self.batch = tensors
    from_dict = classmethod(lambda cls, tensors: cls(tensors))
  stubs = {
      "verl": _stub("verl"), "verl.utils": _stub("verl.utils"),
      "verl.utils.device": _stub("verl.utils.device", get_device_name=lambda: "cpu",
                                 get_torch_device=lambda: torch.cpu),
      "verl.protocol": _stub("verl.protocol", DataProto=DataProto),
      "verl.trainer": _stub("verl.trainer"), "verl.trainer.ppo": _stub("verl.trainer.ppo"),
      "tensordict": _stub("tensordict", TensorDict=object),
      "transformers": _stub("transformers", PreTrainedTokenizer=object),
  }
  loaded = {}
  with pytest.MonkeyPatch.context() as mp:
    for name, module in stubs.items():
      mp.setitem(sys.modules, name, module)
    for name, rel in (("verl.utils.torch_functional", "utils/torch_functional.py"),
                      ("verl.trainer.ppo.mismatch_helper", "trainer/ppo/mismatch_helper.py")):
      spec = importlib.util.spec_from_file_location(name, os.path.join(src, "verl", rel))
      module = importlib.util.module_from_spec(spec)
      mp.setitem(sys.modules, name, module)
      spec.loader.exec_module(module)
      loaded[rel.split("/")[-1][:-3]] = module
  return types.SimpleNamespace(torch=torch, **loaded)


@pytest.mark.parametrize("name,level,mode,veto", [
    ("tis_geometric", "geometric", "truncate", None), ("mis_geometric", "geometric", "mask", None),
    ("tis_token+rs_veto", "token", "truncate", 0.3),
    ("mis_sequence+rs_veto", "sequence", "mask", 0.3)])
def test_geometric_and_veto_match_verl_06(verl06, name, level, mode, veto):
  """verl 0.6.0's compute_rollout_importance_weights: rollout_is_level="geometric" and the
  per-token veto (rollout_is_veto_threshold), which 0.9.1 no longer has."""
  torch = verl06.torch
  worst, zeros, tokens = 0.0, 0, 0
  for seed in range(4):
    behav, prox, mask = _inputs(seed)
    proto, _ = verl06.mismatch_helper.compute_rollout_importance_weights(
        torch.tensor(prox), torch.tensor(behav), torch.tensor(mask, dtype=torch.float32),
        rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=1.05,
        rollout_is_threshold_lower=0.95, rollout_is_veto_threshold=veto)
    want = proto.batch["rollout_is_weights"].numpy()
    rl = rl_defaults(is_correction=name, is_low=0.95, is_high=1.05, rs_veto_threshold=veto or 1.0)
    got, _ = make_correction(rl)(f32(behav), f32(prox), mask)
    worst = max(worst, float(np.max(np.abs(np.asarray(got) - want))))
    zeros, tokens = zeros + np.sum(want[mask] == 0), tokens + mask.sum()
  assert worst <= 1e-6, worst
  assert name == "tis_geometric" or 0 < zeros < tokens  # some tokens dropped, not all


# -- a rollout of an older policy, the old log-probs recomputed -------------------------------

def test_every_correction_on_an_older_policys_rollout_with_recomputed_old_logprobs():
  """The rows' behaviour log-probs (Rollout.logprobs) are an older policy's, the old log-probs
  are recomputed at the update's start (rl.reuse_old_logprobs=False): preparation's weights
  are each correction's of (Rollout.logprobs, the recomputed old log-probs), and the loss
  takes them. The model's passes run once (jitted); each correction then goes through the rest
  of preparation, prepare_from_logprobs, on those old log-probs."""
  from grpo_jax.rl.objective import make_objective  # noqa: PLC0415
  from grpo_jax.rollout.types import Rollout  # noqa: PLC0415
  from grpo_jax.train.learner.experience import (RewardInputs, make_prepare_batch,  # noqa: PLC0415
                                                 prepare_from_logprobs)
  from grpo_jax.train.learner.state import create_train_state  # noqa: PLC0415
  import optax  # noqa: PLC0415
  from grpo_jax.models.decoder import init_params  # noqa: PLC0415
  from tests.fixtures import tiny_model_config  # noqa: PLC0415

  cfg = tiny_model_config(vocab_size=16, num_layers=1)
  rng = np.random.default_rng(0)
  prompts = np.repeat(np.array([[1, 5, 6], [1, 9, 4]], np.int32), 4, 0)
  tokens = rng.integers(3, 16, (8, 5)).astype(np.int32)
  mask = np.arange(5)[None, :] < rng.integers(1, 6, 8)[:, None]
  tokens = np.where(mask, tokens, 0)
  settings = dict(reuse_old_logprobs=False, kl_coef=0.0, is_low=0.9, is_high=1.1,
                  decoupled_cap=1.1, rs_high=1.05, rs_kl_max=0.003)
  rl = rl_defaults(is_correction="decoupled_ppo", **settings)
  prepare = jax.jit(make_prepare_batch(cfg, rl, 4, 1.0, 5))
  inputs = RewardInputs(jnp.linspace(0, 1, 8, dtype=jnp.float32), {}, jnp.int32(0))
  rollout = Rollout(prompts, prompts != 0, tokens, mask, np.zeros(mask.shape, np.float32),
                    np.zeros(8, bool), mask)

  def state_of(params):
    return create_train_state(params, optax.sgd(0.1), jax.random.key(1), None, 0.0)
  # the policy that sampled, older: its log-probs (the same pass, compiled once) are the rows'
  init = jax.jit(lambda key: init_params(cfg, key))  # one compilation, not one per op
  behaviour = prepare(state_of(init(jax.random.key(7))), rollout, inputs)[0]
  rollout = rollout._replace(logprobs=behaviour.old_logprobs)
  batch, _ = prepare(state_of(init(jax.random.key(0))), rollout, inputs)
  old = batch.old_logprobs
  assert np.abs(np.asarray(old - rollout.logprobs)[mask]).mean() > 0.05  # another policy
  names = [n for n, _ in IS_CORRECTIONS.items() if not n.startswith("rs_")] + [
      "rs_seq_mean_k1", "tis_sequence+rs_token_k3"]
  for name in names:
    rl = rl_defaults(is_correction=name, **settings)
    got, metrics = prepare_from_logprobs(rl, 4, 5, rollout, inputs, old_logp=old,
                                         ref_logp=None, old_values=None, kl_coef=0.0)
    want, _ = make_correction(rl)(rollout.logprobs, old, mask)
    np.testing.assert_array_equal(np.asarray(got.is_weights), np.asarray(want), err_msg=name)
    if name == "decoupled_ppo":  # the same as the jitted preparation's
      np.testing.assert_allclose(np.asarray(batch.is_weights), np.asarray(want), rtol=1e-6)
    assert float(metrics["behaviour_kl"]) > 1e-3, name
    if not name.startswith("tis_") or "+" in name:  # each masks some tokens, not all
      assert 0 < float(metrics["is_masked_frac"]) < 1, name
    objective = make_objective(rl)
    grad = jax.grad(lambda lp: objective(lp, old, got.advantages, got.loss_mask,
                                         jnp.zeros(mask.shape), kl_coef=jnp.float32(0.0),
                                         is_weights=got.is_weights)[0])(old)
    assert np.all(np.isfinite(np.asarray(grad))) and np.any(np.asarray(grad)), name
