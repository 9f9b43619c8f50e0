"""The DPO family (grpo_jax/rl/dpo.py) against TRL 1.16's own loss code on identical
log-probs: DPOTrainer._compute_loss (sigmoid, robust, ipo, aot on one pair = cDPO, sigmoid +
sft = RPO), KTOTrainer._compute_loss, CPOTrainer.cpo_loss (simpo) and ORPOTrainer's
odds_ratio_loss, each driven through a stand-in model that returns the given per-token
log-probs. Tolerance 1e-6."""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from grpo_jax.rl import dpo as dpo_lib  # noqa: E402
from grpo_jax.rl.dpo import PREFERENCE_LOSSES, PairLogps  # noqa: E402

B, PROMPT, T = 6, 3, 9  # pairs, prompt tokens, sequence length (prompt + completion slots)


def _accelerator():
  return types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x,
                               gather=lambda x: x, unwrap_model=lambda m: m)


def _trainer_stub(**attrs):
  base = dict(model=types.SimpleNamespace(training=True), accelerator=_accelerator(),
              aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
              f_divergence_type="reverse_kl", use_weighting=False, label_smoothing=0.0,
              _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
              _total_train_tokens=0, _tp_size=1, args=types.SimpleNamespace(discopop_tau=0.05))
  base.update(attrs)
  return types.SimpleNamespace(**base)


class _Model:
  """Returns the given per-token log-probs (rows, T - 1) as TRL's fused LM head would."""

  def __init__(self, per_token):
    self.per_token = per_token

  def __call__(self, **_):
    shape = self.per_token.shape
    return types.SimpleNamespace(log_probs=self.per_token, entropy=torch.zeros(shape),
                                 mean_logits=torch.zeros(shape),
                                 is_top1=torch.zeros(shape, dtype=torch.bool))


@pytest.fixture(scope="module")
def pairs():
  """Random chosen / rejected completions of 1..T-PROMPT tokens, per-token log-probs of the
  policy and the reference (zero outside the completion), as both libraries take them."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, T - PROMPT + 1, size=2 * B)  # chosen rows, then rejected rows
  mask = np.zeros((2 * B, T), np.int64)
  for i, n in enumerate(lengths):
    mask[i, PROMPT:PROMPT + n] = 1
  shifted = mask[:, 1:].astype(np.float64)
  policy = rng.uniform(-2.5, -0.05, (2 * B, T - 1)) * shifted
  ref = rng.uniform(-2.5, -0.05, (2 * B, T - 1)) * shifted
  return dict(mask=mask, policy=policy, ref=ref, lengths=lengths.astype(np.float64))


def _ours(pairs, kl=None) -> PairLogps:
  s, r, n = pairs["policy"].sum(1), pairs["ref"].sum(1), pairs["lengths"]
  f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  return PairLogps(chosen=f(s[:B]), rejected=f(s[B:]), chosen_tokens=f(n[:B]),
                   rejected_tokens=f(n[B:]), ref_chosen=f(r[:B]), ref_rejected=f(r[B:]),
                   kl=None if kl is None else f(kl))


def _trl_dpo(pairs, rows=slice(None), **attrs) -> float:
  from trl import DPOTrainer  # noqa: PLC0415
  idx = np.r_[np.arange(2 * B)[:B][rows], np.arange(2 * B)[B:][rows]]
  ref = pairs["ref"].sum(1)
  half = len(idx) // 2
  inputs = {"input_ids": torch.zeros((len(idx), T), dtype=torch.long),
            "attention_mask": torch.ones((len(idx), T), dtype=torch.long),
            "completion_mask": torch.from_numpy(pairs["mask"][idx]),
            "ref_chosen_logps": torch.from_numpy(ref[idx[:half]]),
            "ref_rejected_logps": torch.from_numpy(ref[idx[half:]])}
  stub = _trainer_stub(**attrs)
  model = _Model(torch.from_numpy(pairs["policy"][idx]))
  return float(DPOTrainer._compute_loss(stub, model, inputs, False))


def _bound(name, **values):
  return PREFERENCE_LOSSES.bind(name, values)


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_equals_trl_sigmoid(pairs, beta):
  ours = float(_bound("dpo", beta=beta)(_ours(pairs)))
  theirs = _trl_dpo(pairs, beta=beta, loss_types=["sigmoid"], loss_weights=[1.0])
  assert abs(ours - theirs) <= 1e-6, (ours, theirs)


def test_rdpo_equals_trl_robust(pairs):
  ours = float(_bound("rdpo", beta=0.3, label_smoothing=0.2)(_ours(pairs)))
  theirs = _trl_dpo(pairs, beta=0.3, label_smoothing=0.2, loss_types=["robust"],
                    loss_weights=[1.0])
  assert abs(ours - theirs) <= 1e-6, (ours, theirs)


def test_cdpo_equals_trl_smoothed_sigmoid(pairs):
  """TRL 1.16's sigmoid loss has no label smoothing; its "aot" loss is cDPO's smoothed sigmoid
  of the batch-sorted log-ratios, which on one pair is cDPO itself: pair by pair."""
  loss = _bound("cdpo", beta=0.2, label_smoothing=0.15)
  p = _ours(pairs)
  for i in range(B):
    one = PairLogps(*[None if x is None else x[i:i + 1] for x in p])
    ours = float(loss(one))
    theirs = _trl_dpo(pairs, rows=slice(i, i + 1), beta=0.2, label_smoothing=0.15,
                      loss_types=["aot"], loss_weights=[1.0])
    assert abs(ours - theirs) <= 1e-6, (i, ours, theirs)


def test_ipo_equals_trl(pairs):
  ours = float(_bound("ipo", beta=0.25)(_ours(pairs)))
  theirs = _trl_dpo(pairs, beta=0.25, loss_types=["ipo"], loss_weights=[1.0])
  assert abs(ours - theirs) <= 1e-6, (ours, theirs)


def test_rpo_equals_trl_sigmoid_plus_sft(pairs):
  ours = float(_bound("rpo", beta=0.1, rpo_alpha=0.7)(_ours(pairs)))
  theirs = _trl_dpo(pairs, beta=0.1, loss_types=["sigmoid", "sft"], loss_weights=[1.0, 0.7])
  assert abs(ours - theirs) <= 1e-6, (ours, theirs)


def test_kto_equals_trl(pairs):
  from trl import KTOTrainer  # noqa: PLC0415
  rng = np.random.default_rng(1)
  kl_logps, ref_kl_logps = rng.uniform(-9, -1, 2 * B), rng.uniform(-9, -1, 2 * B)
  labels = np.r_[np.ones(B, bool), np.zeros(B, bool)]
  inputs = {"input_ids": torch.zeros((2 * B, T), dtype=torch.long),
            "attention_mask": torch.ones((2 * B, T), dtype=torch.long),
            "completion_mask": torch.from_numpy(pairs["mask"]),
            "label": torch.from_numpy(labels),
            "ref_logps": torch.from_numpy(pairs["ref"].sum(1)),
            "ref_KL_logps": torch.from_numpy(ref_kl_logps)}
  for shift in (0.0, 3.0):  # a negative KL estimate (clamped to 0) and a positive one
    stub = _trainer_stub(calculate_KL=True, loss_type="kto", beta=0.3, desirable_weight=1.33,
                         undesirable_weight=0.8,
                         _compute_kl_logps=lambda model, batch, s=shift: torch.from_numpy(
                             kl_logps + s))
    theirs = float(KTOTrainer._compute_loss(stub, _Model(torch.from_numpy(pairs["policy"])),
                                            inputs, False))
    z0 = dpo_lib.kto_reference_point(jnp.asarray(kl_logps + shift), jnp.asarray(ref_kl_logps))
    ours = float(_bound("kto", beta=0.3, desirable_weight=1.33, undesirable_weight=0.8)(
        _ours(pairs, kl=z0)))
    assert abs(ours - theirs) <= 1e-6, (shift, ours, theirs)


def test_unpaired_kto_equals_trl(pairs):
  """KTO on unpaired labelled completions (8 desirable, 4 undesirable, interleaved), against
  KTOTrainer._compute_loss on the same rows and labels."""
  from trl import KTOTrainer  # noqa: PLC0415
  rng = np.random.default_rng(2)
  labels = np.array([1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0], bool)
  kl_logps, ref_kl_logps = rng.uniform(-9, -1, 2 * B), rng.uniform(-9, -1, 2 * B)
  ref = pairs["ref"].sum(1)
  inputs = {"input_ids": torch.zeros((2 * B, T), dtype=torch.long),
            "attention_mask": torch.ones((2 * B, T), dtype=torch.long),
            "completion_mask": torch.from_numpy(pairs["mask"]),
            "label": torch.from_numpy(labels), "ref_logps": torch.from_numpy(ref),
            "ref_KL_logps": torch.from_numpy(ref_kl_logps)}
  for shift in (0.0, 3.0):
    stub = _trainer_stub(calculate_KL=True, loss_type="kto", beta=0.2, desirable_weight=0.75,
                         undesirable_weight=1.5,
                         _compute_kl_logps=lambda model, batch, s=shift: torch.from_numpy(
                             kl_logps + s))
    theirs = float(KTOTrainer._compute_loss(stub, _Model(torch.from_numpy(pairs["policy"])),
                                            inputs, False))
    z0 = dpo_lib.kto_reference_point(jnp.asarray(kl_logps + shift), jnp.asarray(ref_kl_logps))
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    p = PairLogps(chosen=f(pairs["policy"].sum(1)), rejected=None,
                  chosen_tokens=f(pairs["lengths"]), rejected_tokens=None, ref_chosen=f(ref),
                  kl=z0, desirable=jnp.asarray(labels))
    ours = float(_bound("kto", beta=0.2, desirable_weight=0.75, undesirable_weight=1.5)(p))
    assert abs(ours - theirs) <= 1e-6, (shift, ours, theirs)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_simpo_equals_trl_cpo(pairs, smoothing):
  from trl.experimental.cpo import CPOTrainer  # noqa: PLC0415
  stub = types.SimpleNamespace(alpha=0.0, loss_type="simpo", beta=2.0, simpo_gamma=1.2,
                               label_smoothing=smoothing, accelerator=_accelerator())
  avg = pairs["policy"].sum(1) / pairs["lengths"]  # TRL's average_log_prob=True for simpo
  losses, _, _ = CPOTrainer.cpo_loss(stub, torch.from_numpy(avg[:B]), torch.from_numpy(avg[B:]))
  ours = float(_bound("simpo", beta=2.0, simpo_gamma=1.2, label_smoothing=smoothing)(
      _ours(pairs)))
  assert abs(ours - float(losses.mean())) <= 1e-6


def test_orpo_equals_trl_odds_ratio_plus_nll():
  """The odds-ratio term from ORPOTrainer.odds_ratio_loss on TRL's own average log-probs of
  random logits (get_batch_logps), the NLL from torch's cross-entropy over the chosen
  completion tokens (TRL's experimental ORPO also counts the prompt's tokens; the paper's
  L_SFT, and ours, the completion's only)."""
  from trl.experimental.orpo import ORPOTrainer  # noqa: PLC0415
  rng = np.random.default_rng(2)
  vocab = 11
  logits = torch.from_numpy(rng.normal(0, 2, (2 * B, T, vocab)))
  tokens = torch.from_numpy(rng.integers(0, vocab, (2 * B, T)))
  mask = np.zeros((2 * B, T), bool)
  for i, n in enumerate(rng.integers(1, T - PROMPT + 1, 2 * B)):
    mask[i, PROMPT:PROMPT + n] = True
  labels = torch.where(torch.from_numpy(mask), tokens, torch.full_like(tokens, -100))
  avg = ORPOTrainer.get_batch_logps(logits, labels, average_log_prob=True)
  stub = types.SimpleNamespace(beta=0.25, accelerator=_accelerator())
  or_losses, *_ = ORPOTrainer.odds_ratio_loss(stub, avg[:B], avg[B:])
  nll = torch.nn.CrossEntropyLoss()(logits[:B, :-1].reshape(-1, vocab), labels[:B, 1:].reshape(-1))
  theirs = float(nll - or_losses.mean())
  # Ours from the same logits: per-token log-probs of the next token, summed per completion.
  logp = jax.nn.log_softmax(jnp.asarray(logits.numpy())[:, :-1], axis=-1)
  tok = jnp.take_along_axis(logp, jnp.asarray(tokens.numpy())[:, 1:, None], -1)[..., 0]
  m = jnp.asarray(mask[:, 1:])
  sums, counts = jnp.where(m, tok, 0.0).sum(1), m.sum(1).astype(jnp.float32)
  p = PairLogps(sums[:B], sums[B:], counts[:B], counts[B:])
  ours = float(_bound("orpo", beta=0.25)(p))
  assert abs(ours - theirs) <= 1e-6, (ours, theirs)


def test_reference_free_and_kl_flags():
  assert {n for n, f in PREFERENCE_LOSSES.items() if getattr(f, "reference_free", False)} == {
      "simpo", "orpo"}
  assert [n for n, f in PREFERENCE_LOSSES.items() if getattr(f, "needs_kl", False)] == ["kto"]


def test_bad_hyperparameters_are_one_sentence():
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  with pytest.raises(ConfigError, match="dpo.label_smoothing=0.5"):
    _bound("cdpo", beta=0.1, label_smoothing=0.5)
  with pytest.raises(ConfigError, match="dpo.beta=0"):
    _bound("dpo", beta=0.0)
  # NaN and inf passed (`beta <= 0` is False for NaN): every loss NaN, every update skipped,
  # and the run ended "done" with its untrained policy exported.
  for name, values, field in (("dpo", dict(beta=float("nan")), "beta=nan"),
                              ("ipo", dict(beta=float("inf")), "beta=inf"),
                              ("simpo", dict(beta=0.1, simpo_gamma=float("nan")), "simpo_gamma"),
                              ("rpo", dict(beta=0.1, rpo_alpha=-1.0), "rpo_alpha=-1.0"),
                              ("kto", dict(beta=0.1, desirable_weight=-1.0), "desirable_weight"),
                              ("kto", dict(beta=0.1, undesirable_weight=float("inf")),
                               "undesirable_weight=inf")):
    with pytest.raises(ConfigError, match=f"dpo.{field}"):
      _bound(name, **values)
  assert _bound("kto", beta=0.1, desirable_weight=0.0).keywords["desirable_weight"] == 0.0


def test_orpo_at_a_chosen_log_prob_of_zero_has_the_limits_gradient():
  """float32's log-softmax rounds a confident token's log-prob to exactly 0, where the odds are
  infinite (the gradient was NaN, and the guarded update skipped the batch): ORPO's gradient
  there is the limit's, -1/|y_c| - β odds_r / |y_c|; below -1e-6 loss and gradient are the
  plain formula's, bit for bit."""
  def loss(chosen, formula=False):
    p = PairLogps(chosen, jnp.array([-5.0]), jnp.array([2.0]), jnp.array([3.0]))
    if not formula:
      return dpo_lib.orpo(p, beta=0.1)
    a_c, a_r = chosen / 2.0, jnp.array([-5.0]) / 3.0
    log_odds = (a_c - a_r) - (dpo_lib.log1mexp(a_c) - dpo_lib.log1mexp(a_r))
    return dpo_lib.chosen_nll(p) - 0.1 * jnp.mean(jax.nn.log_sigmoid(log_odds))
  odds_r = np.exp(-5 / 3) / (1 - np.exp(-5 / 3))
  grad = jax.grad(loss)(jnp.array([0.0]))
  np.testing.assert_allclose(grad, [-0.5 - 0.1 * odds_r / 2], rtol=1e-5)
  assert abs(float(loss(jnp.array([0.0])))) < 1e-8
  for chosen in (-2.01e-6, -2e-3, -3.0):
    c = jnp.array([chosen])
    assert loss(c) == loss(c, True) and jax.grad(loss)(c) == jax.grad(loss)(c, True), chosen
