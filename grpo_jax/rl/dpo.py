"""Preference-optimisation losses, the DPO family (python -m grpo_jax.train_dpo;
docs/dpo_family.md#the-losses), on per-sequence log-probs.

Every loss takes one `PairLogps` (per pair i: the summed log-probs of the chosen and the
rejected completion under the policy and, where the loss has one, the frozen reference; the
completions' token counts) and returns the batch's scalar loss. With

    Δ_i = [log π(y_c|x) - log π_ref(y_c|x)] - [log π(y_r|x) - log π_ref(y_r|x)]

the entries are (defaults and conventions: TRL 1.16, whose code they equal, tests/test_dpo.py):

    dpo     -log σ(βΔ)                                (Rafailov et al. 2023; TRL "sigmoid")
    cdpo    -(1-ε) log σ(βΔ) - ε log σ(-βΔ)           (conservative DPO: labels flipped with
                                                       probability ε)
    rdpo    [-(1-ε) log σ(βΔ) + ε log σ(-βΔ)] / (1-2ε) (robust DPO; TRL "robust")
    ipo     (Δ_c/|y_c| - Δ_r/|y_r| - 1/(2β))^2               (Azar et al.; per-token Δ as TRL)
    kto     mean over the 2B completions of
              w_D (1 - σ(β(Δ_c - z0)))  for each chosen,
              w_U (1 - σ(β(z0 - Δ_r)))  for each rejected    (Ethayarajh et al.; unpaired: a pair
                                                              is one desirable and one undesirable
                                                              example; z0 = max(0, mean KL
                                                              estimate), no gradient)
            or, on unpaired {prompt, completion, label} data (PairLogps.desirable set), the mean
            over the B completions of the term their label picks (TRL's KTOTrainer)
    simpo   -(1-ε) log σ(βh - γ) - ε log σ(γ - βh),
            h = log π(y_c|x)/|y_c| - log π(y_r|x)/|y_r|
                                                             (Meng et al.; reference-free; TRL
                                                              CPOTrainer loss_type="simpo",
                                                              cpo_alpha=0)
    orpo    NLL - β mean log σ(log odds),
            log odds = (ā_c - ā_r) - (log(1-e^ā_c) - log(1-e^ā_r)),  ā = log π(y|x)/|y|
                                                             (Hong et al.; reference-free)
    rpo     dpo + α NLL                                      (Pang et al., Iterative Reasoning
                                                              Preference Optimization; TRL
                                                              loss_type=["sigmoid", "sft"])

NLL is the chosen completions' token-mean negative log-likelihood over the batch,
-Σ_i log π(y_c,i|x_i) / Σ_i |y_c,i| (TRL's "sft" term and ORPO's cross-entropy). The reference-
free entries carry `reference_free = True` (no reference model is kept or run); kto carries
`needs_kl = True` (the stage estimates z0 on mismatched pairs, prompt i with the chosen
completion of pair i - 1, as TRL's KL dataset does).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.registry import Registry

PREFERENCE_LOSSES = Registry("dpo.loss")


class PairLogps(NamedTuple):
  """Per pair (each (B,)): summed completion log-probs and token counts; the reference's sums
  (None for a reference-free loss); KTO's reference point z0 (a scalar, else None). Unpaired
  (KTO's labelled completions): `chosen`, `chosen_tokens` and `ref_chosen` hold every
  completion's, the rejected fields are None and `desirable` (B,) bool is each one's label."""
  chosen: jax.Array
  rejected: jax.Array
  chosen_tokens: jax.Array
  rejected_tokens: jax.Array
  ref_chosen: jax.Array | None = None
  ref_rejected: jax.Array | None = None
  kl: jax.Array | None = None
  desirable: jax.Array | None = None


def logratios(p: PairLogps):
  """(log π/π_ref of each chosen, of each rejected completion)."""
  return p.chosen - p.ref_chosen, p.rejected - p.ref_rejected


def chosen_nll(p: PairLogps):
  """-Σ_i log π(y_c,i|x_i) / Σ_i |y_c,i|: the chosen tokens' mean negative log-likelihood."""
  return -jnp.sum(p.chosen) / jnp.maximum(jnp.sum(p.chosen_tokens), 1.0)


def _per_token(logp, tokens):
  return logp / jnp.maximum(tokens, 1.0)


def _smoothed_sigmoid_loss(x, eps):
  """-(1-ε) log σ(x) - ε log σ(-x), elementwise."""
  return -(1.0 - eps) * jax.nn.log_sigmoid(x) - eps * jax.nn.log_sigmoid(-x)


def log1mexp(x):
  """log(1 - e^x) for x < 0, branching at -log 2 (Mächler 2012)."""
  return jnp.where(x < -0.6931471805599453, jnp.log1p(-jnp.exp(x)), jnp.log(-jnp.expm1(x)))


def check_smoothing(label_smoothing=0.0, **_):
  if not 0.0 <= label_smoothing < 0.5:
    return (f"dpo.label_smoothing={label_smoothing}: the chance that a pair's labels are "
            f"flipped must lie in [0, 0.5).")
  return None


# A loss's numeric hyperparameters: (whether a finite value is in range, what it must be).
_RANGES = {"beta": (lambda v: v > 0, "the preference temperature must be a finite number > 0"),
           "simpo_gamma": (lambda v: True, "the target reward margin must be a finite number"),
           "rpo_alpha": (lambda v: v >= 0, "the NLL term's weight must be a finite number >= 0"),
           "desirable_weight": (lambda v: v >= 0, "a loss weight must be a finite number >= 0"),
           "undesirable_weight": (lambda v: v >= 0, "a loss weight must be a finite number >= 0")}


def check_beta(beta=0.1, **kw):
  """A sentence for the first hyperparameter out of its range (_RANGES; NaN and inf are in
  none), else check_smoothing's."""
  for name, value in {"beta": beta, **kw}.items():
    in_range, must = _RANGES.get(name, (None, ""))
    if in_range is not None and not (math.isfinite(value) and in_range(value)):
      return f"dpo.{name}={value}: {must}."
  return check_smoothing(**kw)


@PREFERENCE_LOSSES.register("dpo", check=check_beta)
def dpo(p: PairLogps, *, beta=0.1):
  """mean -log σ(βΔ)."""
  c, r = logratios(p)
  return jnp.mean(-jax.nn.log_sigmoid(beta * (c - r)))


@PREFERENCE_LOSSES.register("cdpo", check=check_beta)
def cdpo(p: PairLogps, *, beta=0.1, label_smoothing=0.0):
  """mean -(1-ε) log σ(βΔ) - ε log σ(-βΔ)."""
  c, r = logratios(p)
  return jnp.mean(_smoothed_sigmoid_loss(beta * (c - r), label_smoothing))


@PREFERENCE_LOSSES.register("rdpo", check=check_beta)
def rdpo(p: PairLogps, *, beta=0.1, label_smoothing=0.0):
  """mean [-(1-ε) log σ(βΔ) + ε log σ(-βΔ)] / (1 - 2ε)."""
  c, r = logratios(p)
  x = beta * (c - r)
  eps = label_smoothing
  return jnp.mean((-(1.0 - eps) * jax.nn.log_sigmoid(x) + eps * jax.nn.log_sigmoid(-x))
                  / (1.0 - 2.0 * eps))


@PREFERENCE_LOSSES.register("ipo", check=check_beta)
def ipo(p: PairLogps, *, beta=0.1):
  """mean (Δ_c/|y_c| - Δ_r/|y_r| - 1/(2β))^2."""
  c, r = logratios(p)
  h = _per_token(c, p.chosen_tokens) - _per_token(r, p.rejected_tokens)
  return jnp.mean((h - 1.0 / (2.0 * beta)) ** 2)


@PREFERENCE_LOSSES.register("kto", check=check_beta)
def kto(p: PairLogps, *, beta=0.1, desirable_weight=1.0, undesirable_weight=1.0):
  """Mean over the 2B completions of w_D (1 - σ(β(Δ_c - z0))) and w_U (1 - σ(β(z0 - Δ_r)));
  unpaired, over the B labelled completions, each with its label's term."""
  z0 = jax.lax.stop_gradient(p.kl)
  desirable = lambda d: desirable_weight * (1.0 - jax.nn.sigmoid(beta * (d - z0)))  # noqa: E731
  undesirable = lambda d: undesirable_weight * (1.0 - jax.nn.sigmoid(beta * (z0 - d)))  # noqa: E731
  if p.desirable is not None:
    d = p.chosen - p.ref_chosen
    return jnp.mean(jnp.where(p.desirable, desirable(d), undesirable(d)))
  c, r = logratios(p)
  return jnp.mean(jnp.concatenate([desirable(c), undesirable(r)]))


kto.needs_kl = True


def kto_reference_point(kl_logps, ref_kl_logps):
  """z0 = max(0, mean_i [log π(y_i'|x_i) - log π_ref(y_i'|x_i)]) over mismatched pairs, no
  gradient (KTO's estimate of KL(π || π_ref); TRL clamps it the same way)."""
  return jax.lax.stop_gradient(jnp.maximum(jnp.mean(kl_logps - ref_kl_logps), 0.0))


@PREFERENCE_LOSSES.register("simpo", check=check_beta)
def simpo(p: PairLogps, *, beta=0.1, simpo_gamma=0.5, label_smoothing=0.0):
  """mean -(1-ε) log σ(βh - γ) - ε log σ(γ - βh), h the per-token log-prob difference."""
  h = _per_token(p.chosen, p.chosen_tokens) - _per_token(p.rejected, p.rejected_tokens)
  return jnp.mean(_smoothed_sigmoid_loss(beta * h - simpo_gamma, label_smoothing))


simpo.reference_free = True


ODDS_CEILING = -1e-7  # the highest per-token mean log-prob ORPO's odds take (below)


def _below_ceiling(a):
  """a, or ODDS_CEILING where a is above it, with the gradient passed straight through: float32's
  log-softmax rounds a confident token's log-prob to 0, where log(1 - e^a) is -inf and its
  gradient NaN; at the ceiling the odds term's gradient is its limit at 0 to 1e-6."""
  return jnp.where(a > ODDS_CEILING, a + jax.lax.stop_gradient(ODDS_CEILING - a), a)


@PREFERENCE_LOSSES.register("orpo", check=check_beta)
def orpo(p: PairLogps, *, beta=0.1):
  """NLL - β mean log σ(log odds of the chosen over the rejected completion), the odds of a
  per-token mean log-prob above ODDS_CEILING (1e-7 from certainty) taken at the ceiling."""
  a_c = _per_token(p.chosen, p.chosen_tokens)
  a_r = _per_token(p.rejected, p.rejected_tokens)
  log_odds = (a_c - a_r) - (log1mexp(_below_ceiling(a_c)) - log1mexp(_below_ceiling(a_r)))
  return chosen_nll(p) - beta * jnp.mean(jax.nn.log_sigmoid(log_odds))


orpo.reference_free = True


@PREFERENCE_LOSSES.register("rpo", check=check_beta)
def rpo(p: PairLogps, *, beta=0.1, rpo_alpha=1.0):
  """dpo + α NLL of the chosen completions."""
  return dpo(p, beta=beta) + rpo_alpha * chosen_nll(p)


def implicit_rewards(p: PairLogps, beta: float, reference_free: bool):
  """(chosen, rejected) rewards as TRL logs them: β log π/π_ref, or β times the per-token
  log-prob for a reference-free loss (unpaired: every completion's, and None)."""
  if p.desirable is not None:
    return beta * (p.chosen - p.ref_chosen), None
  if reference_free:
    return (beta * _per_token(p.chosen, p.chosen_tokens),
            beta * _per_token(p.rejected, p.rejected_tokens))
  c, r = logratios(p)
  return beta * c, beta * r
