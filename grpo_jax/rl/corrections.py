"""Off-policy corrections: importance weights for tokens sampled by a behaviour policy mu (the
sampler: `Rollout.logprobs`) and trained on with a proximal policy pi_prox (the policy's
log-probs recomputed at the update's start, `old_logprobs`; the current policy, stop-gradient,
when the update reuses its own, experience.reuses_current_logprobs). Selected with
rl.is_correction; the weights w multiply the policy-gradient loss per token (rl/objective.py),
as verl's `rollout_is_weights` multiply its `pg_losses`:

    rho_t  = pi_prox(o_t) / mu(o_t) = exp(clip(log pi_prox_t - log mu_t, -20, 20))
    R_i    = prod_t rho_t = exp(clip(sum_t m_t (log pi_prox_t - log mu_t), -20, 20))

    "none"          w = 1 (or rl.tis_cap's truncated weights, losses.truncated_is_weights)
    "tis_token"     w_t = min(rho_t, C)                                 (truncated IS, token)
    "tis_sequence"  w_t = min(R_i, C)                                   (truncated IS, sequence)
    "mis_token"     w_t = rho_t  if a <= rho_t <= C  else 0             (masked IS: IcePop)
    "mis_sequence"  w_t = R_i    if a <= R_i <= C    else 0             (masked IS, sequence)
    "tis_geometric" w_t = min(G_i, C), G_i = exp(mean_t m_t log rho_t)  (verl 0.6 "geometric")
    "mis_geometric" w_t = G_i    if a <= G_i <= C    else 0
    "decoupled_ppo" w_t = rho_t  (0 where rho_t > C' when rl.decoupled_cap = C' > 0)

with C = rl.is_high, a = rl.is_low; no gradient flows through w; 0 where ~mask. With
rl.is_batch_normalize the tis_* / mis_* weights are divided by their batch mean
(`batch_normalize`, verl's rollout_is_batch_normalize). The "rs_*" entries are verl's
rejection sampling (rollout_rs, 0/1 weights; grpo_jax/rl/rejection.py); "+" joins entries into
one whose weight is their product, at most one of them not "rs_*": "tis_sequence+rs_seq_mean_k1"
is verl's rollout_is="sequence" with rollout_rs="seq_mean_k1" (its decoupled_geo_rs_seq_tis
preset). The first four are verl's rollout correction (verl/trainer/ppo/rollout_corr_helper.py
`compute_rollout_correction_weights`: rollout_is = "token" / "sequence", a single
rollout_is_threshold truncates, a "lower_upper" one masks), checked against that function in
tests/test_corrections.py. "decoupled_ppo" is AReaL's decoupled PPO objective (arXiv 2505.24298,
eq. (5)): with rl.loss = "ppo_clip" the loss becomes

    J = E_mu[ pi_prox / mu * min(u_t A_t, clip(u_t, 1 - eps, 1 + eps) A_t) ],  u_t = pi / pi_prox

the proximal policy's trust region, separate from the behaviour policy's; AReaL's
behav_imp_weight_cap drops tokens whose pi_prox / mu exceeds it (rl.decoupled_cap).

CISPO (MiniMax-M1) is a policy loss, rl.loss = "cispo" (`cispo_loss` below), so that it keeps
the objective's KL, entropy, aggregation and these weights, as verl's loss_mode = "cispo".

Each correction reports (`correction_sums`, sums that add up over micro-batches): is_ratio
(mean of rho_t), is_ratio_max / is_ratio_min, is_weight (mean of w_t), is_masked_frac (the
tokens whose weight the correction set to 0), behaviour_kl (the k3 estimate of KL(mu || pi_prox)
per token, rho - 1 - log rho, on mu's samples) and, given per-row staleness (policy versions
between mu and pi_prox), staleness_mean / staleness_max.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.errors import ConfigError
from grpo_jax.registry import hyperparameters
from grpo_jax.rl._checks import as_token_mask, require_shape
from grpo_jax.rl.losses import POLICY_LOSSES, _masked_inputs, check_log_ratio_clamp

from grpo_jax.rl import rejection  # noqa: F401  registers the "rs_*" entries
from grpo_jax.rl.correction_registry import IS_CORRECTIONS, SAFETY_BOUND  # noqa: F401

# The sums of `correction_sums` divided by the tokens, and those reduced by max / min.
CORRECTION_MEANS = ("is_ratio", "is_weight", "is_masked_frac", "behaviour_kl")
CORRECTION_MAX = ("is_ratio_max", "staleness_max")
CORRECTION_MIN = ("is_ratio_min",)


def _log_ratio(behaviour_logp, proximal_logp, mask):
  """(mask, log pi_prox - log mu with 0 where ~mask), both (B, N)."""
  mask = as_token_mask(mask, proximal_logp)
  require_shape("behaviour_logp", behaviour_logp, mask.shape)
  return mask, jnp.where(mask, proximal_logp - behaviour_logp, 0.0)


def token_ratio(behaviour_logp, proximal_logp, mask):
  """rho_t = exp(clip(log pi_prox_t - log mu_t, -20, 20)), 0 where ~mask; (B, N)."""
  mask, log_ratio = _log_ratio(behaviour_logp, proximal_logp, mask)
  ratio = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
  return jnp.where(mask, ratio, 0.0)


def sequence_ratio(behaviour_logp, proximal_logp, mask):
  """R_i = exp(clip(sum_t m_t (log pi_prox_t - log mu_t), -20, 20)) on each of row i's masked
  tokens, 0 where ~mask; (B, N)."""
  mask, log_ratio = _log_ratio(behaviour_logp, proximal_logp, mask)
  total = jnp.clip(jnp.sum(log_ratio, axis=-1, keepdims=True), -SAFETY_BOUND, SAFETY_BOUND)
  return jnp.where(mask, jnp.exp(total), 0.0)


def geometric_ratio(behaviour_logp, proximal_logp, mask):
  """G_i = exp(clip(sum_t m_t (log pi_prox_t - log mu_t) / sum_t m_t, -20, 20)), the geometric
  mean of row i's rho_t, on each of its masked tokens, 0 where ~mask; (B, N)."""
  mask, log_ratio = _log_ratio(behaviour_logp, proximal_logp, mask)
  count = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1).astype(log_ratio.dtype)
  mean = jnp.clip(jnp.sum(log_ratio, axis=-1, keepdims=True) / count, -SAFETY_BOUND,
                  SAFETY_BOUND)
  return jnp.where(mask, jnp.exp(mean), 0.0)


def truncate(ratio, mask, cap: float):
  """w = sg[min(ratio, cap)] where mask, else 0 (truncated IS)."""
  return jax.lax.stop_gradient(jnp.where(mask, jnp.minimum(ratio, cap), 0.0))


def mask_outside(ratio, mask, low: float, high: float):
  """w = sg[ratio] where mask and low <= ratio <= high, else 0 (masked IS, IcePop)."""
  keep = mask & (ratio >= low) & (ratio <= high)
  return jax.lax.stop_gradient(jnp.where(keep, ratio, 0.0))


def batch_normalize(weights, mask, per_row: bool):
  """verl's rollout_is_batch_normalize: w / mean(w), the mean over the batch's masked tokens
  (per_row False) or over its rows with tokens of each row's mean weight (per_row True, the
  sequence modes); w unchanged when that mean is <= 1e-8. The batch is the rows this sees (all
  of a step's when preparation computes the weights; config.py refuses micro-batches)."""
  mask = as_token_mask(mask, weights)
  if per_row:
    count = jnp.sum(mask, axis=-1)
    row_mean = jnp.sum(jnp.where(mask, weights, 0.0), axis=-1) / jnp.maximum(count, 1)
    rows = count > 0
    mean = jnp.sum(jnp.where(rows, row_mean, 0.0)) / jnp.maximum(jnp.sum(rows), 1)
  else:
    mean = jnp.sum(jnp.where(mask, weights, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
  return jax.lax.stop_gradient(jnp.where(mean > 1e-8, weights / mean, weights))


def _check_cap(is_high=2.0, **_):
  if not is_high > 0:
    return f"rl.is_high={is_high}; the importance-weight cap must be positive (verl's 2.0)."
  return None


def _check_bounds(is_low=0.5, is_high=2.0, **_):
  if not 0 <= is_low <= is_high or not is_high > 0:
    return (f"rl.is_low={is_low}, rl.is_high={is_high}; the masked modes keep ratios in "
            f"[is_low, is_high] and need 0 <= is_low <= is_high, is_high > 0 (e.g. 0.5 and 2.0).")
  return None


def _check_decoupled(decoupled_cap=0.0, **_):
  if not (decoupled_cap == 0 or decoupled_cap > 1):
    return (f"rl.decoupled_cap={decoupled_cap}; use 0 (no cap) or a cap > 1 on pi_prox / mu "
            f"(AReaL's behav_imp_weight_cap, e.g. 5.0).")
  return None


# level -> (its ratio, whether rl.is_batch_normalize averages per row): the tis_* / mis_* entries
_RATIOS = {"token": (token_ratio, False), "sequence": (sequence_ratio, True),
           "geometric": (geometric_ratio, True)}


def _register_weight(mode: str, level: str) -> None:
  """Registers "<mode>_<level>" (module docstring): "tis" w = sg[min(ratio, is_high)], "mis"
  w = sg[ratio] where is_low <= ratio <= is_high, else 0; with is_batch_normalize,
  `batch_normalize`d."""
  ratio, per_row = _RATIOS[level]
  if mode == "tis":
    def fn(behaviour_logp, proximal_logp, mask, *, is_high=2.0, is_batch_normalize=False):
      mask = as_token_mask(mask, proximal_logp)
      w = truncate(ratio(behaviour_logp, proximal_logp, mask), mask, is_high)
      return batch_normalize(w, mask, per_row) if is_batch_normalize else w
  else:
    def fn(behaviour_logp, proximal_logp, mask, *, is_low=0.5, is_high=2.0,
           is_batch_normalize=False):
      mask = as_token_mask(mask, proximal_logp)
      w = mask_outside(ratio(behaviour_logp, proximal_logp, mask), mask, is_low, is_high)
      return batch_normalize(w, mask, per_row) if is_batch_normalize else w
  fn.__name__ = fn.__qualname__ = f"{mode}_{level}"
  IS_CORRECTIONS.register(fn.__name__, fn, check=_check_cap if mode == "tis" else _check_bounds)


for _name in ("tis_token", "tis_sequence", "mis_token", "mis_sequence", "tis_geometric",
              "mis_geometric"):
  _register_weight(*_name.split("_"))


@IS_CORRECTIONS.register("decoupled_ppo", check=_check_decoupled)
def decoupled_ppo(behaviour_logp, proximal_logp, mask, *, decoupled_cap=0.0):
  """AReaL's behaviour weight (arXiv 2505.24298, eq. (5)): w_t = sg[pi_prox_t / mu_t], 0 where
  it exceeds decoupled_cap > 0 (their behav_imp_weight_cap; 0 = no cap)."""
  mask = as_token_mask(mask, proximal_logp)
  ratio = token_ratio(behaviour_logp, proximal_logp, mask)
  return mask_outside(ratio, mask, 0.0, decoupled_cap if decoupled_cap else jnp.inf)


def correction_sums(behaviour_logp, proximal_logp, weights, mask, staleness=None) -> dict:
  """The corrections' metrics as sums over `mask` (divide CORRECTION_MEANS by is_tokens; the
  _max / _min ones are extrema, -inf / inf without tokens): is_ratio (rho_t), is_weight (w_t),
  is_masked_frac (w_t == 0 where rho_t > 0), behaviour_kl (k3: rho - 1 - log rho, an unbiased
  estimate of KL(mu || pi_prox) on mu's samples), is_ratio_max / is_ratio_min; staleness (B,)
  given: staleness (summed over rows) and staleness_max, with is_rows."""
  mask, log_ratio = _log_ratio(behaviour_logp, proximal_logp, mask)
  log_ratio = jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
  ratio = jnp.exp(log_ratio)
  sums = dict(
      is_ratio=jnp.sum(jnp.where(mask, ratio, 0.0)),
      is_weight=jnp.sum(jnp.where(mask, weights, 0.0)),
      is_masked_frac=jnp.sum(mask & (weights == 0)).astype(jnp.float32),
      behaviour_kl=jnp.sum(jnp.where(mask, ratio - 1.0 - log_ratio, 0.0)),
      is_ratio_max=jnp.max(jnp.where(mask, ratio, -jnp.inf)),
      is_ratio_min=jnp.min(jnp.where(mask, ratio, jnp.inf)),
      is_tokens=jnp.sum(mask).astype(jnp.float32))
  if staleness is not None:
    staleness = jnp.asarray(staleness, jnp.float32)
    sums.update(staleness=jnp.sum(staleness), staleness_max=jnp.max(staleness),
                is_rows=jnp.float32(staleness.shape[0]))
  return jax.tree.map(jax.lax.stop_gradient, sums)


def correction_metrics(sums: dict) -> dict:
  """The metrics of (summed) correction_sums: the means divided by the tokens (rows for
  staleness_mean), the extrema as they are."""
  tokens = jnp.maximum(sums["is_tokens"], 1.0)
  out = {k: sums[k] / tokens for k in CORRECTION_MEANS}
  out.update({k: sums[k] for k in CORRECTION_MAX + CORRECTION_MIN if k in sums})
  if "staleness" in sums:
    out["staleness_mean"] = sums["staleness"] / jnp.maximum(sums["is_rows"], 1.0)
  return out


def correction_parts(name: str) -> list[str]:
  """The entries of rl.is_correction = "a+b+...", checked: distinct, and at most one of them an
  importance weight (not "rs_*"); [] for "none"."""
  if name == "none":
    return []
  parts = [part.strip() for part in name.split("+")]
  weights = [part for part in parts if not part.startswith("rs_")]
  if len(parts) > 1 and ("none" in parts or len(set(parts)) < len(parts) or len(weights) > 1):
    raise ConfigError(f"rl.is_correction={name!r} joins entries that do not compose; join one "
                      f"importance weight (tis_*, mis_*, decoupled_ppo) with distinct rs_* "
                      f"rejections, e.g. 'tis_sequence+rs_seq_mean_k1'.")
  return parts


def make_correction(rl):
  """correct(behaviour_logp, proximal_logp, mask, staleness=None) -> (weights (B, N), sums)
  for rl.is_correction with its hyperparameters bound (checked) here; None for "none". A
  "+"-joined name weighs by the product of its entries' weights."""
  parts = correction_parts(rl.get("is_correction", "none"))
  if rl.get("is_batch_normalize", False) and not any(
      "is_batch_normalize" in hyperparameters(IS_CORRECTIONS.get(part)) for part in parts):
    raise ConfigError(f"rl.is_batch_normalize=True normalises the tis_* / mis_* weights, but "
                      f"rl.is_correction={rl.get('is_correction', 'none')!r} has none; add one "
                      f"or set rl.is_batch_normalize=False.")
  fns = [IS_CORRECTIONS.bind(part, rl) for part in parts]
  if not fns:
    return None

  def correct(behaviour_logp, proximal_logp, mask, staleness=None):
    weights = fns[0](behaviour_logp, proximal_logp, mask)
    for fn in fns[1:]:
      weights = weights * fn(behaviour_logp, proximal_logp, mask)
    return weights, correction_sums(behaviour_logp, proximal_logp, weights, mask, staleness)
  return correct


def cispo_loss(logprobs, old_logprobs, advantages, mask, eps_low: float, eps_high: float,
               log_ratio_clamp: float | None = 20.0):
  """CISPO, MiniMax-M1 (arXiv 2506.13585, section 3.1, eqs. (4)-(5)), per token (to minimise):

      r_t  = exp(clip(logp_t - logp_old_t, -c, c))        (c = log_ratio_clamp; None: no clip)
      r^_t = clip(r_t, 1 - eps_low, 1 + eps_high)
      L_t  = -sg[r^_t] A_t log pi_theta(o_t)

  so dL_t/dlogp_t = -r^_t A_t: every token keeps its gradient, only the IS weight is clipped.
  The paper's 1 / sum_i |o_i| is rl.loss_aggregation = "token-mean". Returns (loss (B, T),
  metrics): clipped (r^_t != r_t) and ratio (r_t)."""
  mask, (logprobs, old_logprobs, advantages) = _masked_inputs(mask, logprobs, old_logprobs,
                                                              advantages)
  log_ratio = logprobs - old_logprobs
  if log_ratio_clamp is not None:
    log_ratio = jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp)
  ratio = jax.lax.stop_gradient(jnp.exp(log_ratio))
  clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.where(mask, -clipped_ratio * advantages * logprobs, 0.0)
  metrics = dict(clipped=mask & (clipped_ratio != ratio), ratio=jnp.where(mask, ratio, 0.0))
  return loss, metrics


def _check_cispo(cispo_eps_low=10.0, cispo_eps_high=0.2, log_ratio_clamp=20.0, **_):
  if not (cispo_eps_low > 0 and cispo_eps_high > 0):
    return (f"rl.cispo_eps_low={cispo_eps_low}, rl.cispo_eps_high={cispo_eps_high}; use "
            f"positive values (verl's CISPO recipe: 10, no lower bound in effect, and 0.2).")
  return check_log_ratio_clamp(log_ratio_clamp)


@POLICY_LOSSES.register("cispo", check=_check_cispo)
def cispo(logprobs, old_logprobs, advantages, mask, *, cispo_eps_low=10.0, cispo_eps_high=0.2,
          log_ratio_clamp=20.0):
  """cispo_loss: the IS weight clipped to [1 - cispo_eps_low, 1 + cispo_eps_high] (the paper
  tunes only the upper bound; verl's recipe: 10 and 0.2); log_ratio_clamp 0 = off."""
  return cispo_loss(logprobs, old_logprobs, advantages, mask, cispo_eps_low, cispo_eps_high,
                    log_ratio_clamp or None)

