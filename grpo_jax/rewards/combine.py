"""Several rewards per completion combined into one: components (B, R), one column per reward,
weights (R,). Rows are grouped contiguously as in grpo_jax.rl.advantages (rows
[g*G, (g+1)*G) are the G completions of prompt g).

  mode                 r_b
  sum                  sum_r w_r c_{b,r}
  normalise_then_sum   sum_r w_r (c_{b,r} - mean_g c_r) / (std_g c_r + eps)     (GDPO)

"sum" is the usual sum-then-normalise: the advantage estimator then normalises r per group.
"normalise_then_sum" is GDPO's group reward-decoupled normalisation (Liu et al. 2026, arXiv
2601.05242): each reward is normalised within its group before the weighted sum, so two rewards
on different scales, or a dense one beside a sparse one, cannot drown each other out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rl._checks import require_shape
from grpo_jax.rl.advantages import group_normalized_advantages

COMBINE_MODES = ("sum", "normalise_then_sum")


def combine_rewards(components: jax.Array, weights: jax.Array, group_size: int, mode: str,
                    eps: float = 1e-6) -> jax.Array:
  """One reward per row, (B,) float32, from components (B, R) and weights (R,).

      sum:                 r_b = sum_r w_r c_{b,r}
      normalise_then_sum:  r_b = sum_r w_r (c_{b,r} - mean_g c_r) / (std_g c_r + eps)

  mean_g / std_g are over row b's group of group_size rows, with the unbiased (n-1) standard
  deviation of group_normalized_advantages (so normalise_then_sum needs group_size >= 2). A
  component with no spread in a group adds exactly 0 there. Components must be finite.

  GDPO itself goes one step further: the official code (NVlabs/GDPO, its TRL trainer) then
  normalises this sum over the whole batch, batch_normalise(r, eps=1e-4), and uses the result
  as the advantage directly. To reproduce it, pass normalise_then_sum's output through
  batch_normalise and use that as the advantage instead of group-normalising it again.
  """
  if mode not in COMBINE_MODES:
    raise ValueError(f"Unknown reward combination {mode!r}; valid: {', '.join(COMBINE_MODES)}.")
  if jnp.ndim(components) != 2:
    raise ValueError(f"components must be (B, R), one column per reward; got shape "
                     f"{tuple(jnp.shape(components))}.")
  rows, count = jnp.shape(components)
  require_shape("weights", weights, (count,))
  if group_size < 1 or rows % group_size:
    raise ValueError(f"components of shape {(rows, count)} cannot be split into groups of "
                     f"{group_size}; expected (num_prompts * group_size, R).")
  components = jnp.asarray(components).astype(jnp.float32)
  weights = jnp.asarray(weights).astype(jnp.float32)
  if mode == "normalise_then_sum":
    normalise = lambda column: group_normalized_advantages(column, group_size, eps)  # noqa: E731
    components = jax.vmap(normalise, in_axes=1, out_axes=1)(components)
  return jnp.sum(components * weights[None, :], axis=1)


def batch_normalise(x: jax.Array, eps: float = 1e-6) -> jax.Array:
  """GDPO's batch-wise advantage normalisation over all B rows, (B,) float32.

      x' = (x - mean(x)) / (std(x) + eps)

  with the unbiased (n-1) standard deviation, as GDPO's TRL code does (torch .std(), eps=1e-4).
  After normalise_then_sum mean(x) is already 0 (every group's is), so this rescales the batch
  to unit spread whatever the number of rewards. B must be at least 2.
  """
  if jnp.ndim(x) != 1:
    raise ValueError(f"x must be (B,); got shape {tuple(jnp.shape(x))}.")
  if jnp.shape(x)[0] < 2:
    raise ValueError("a batch of one value has no standard deviation; use B >= 2.")
  x = jnp.asarray(x).astype(jnp.float32)
  return (x - jnp.mean(x)) / (jnp.std(x, ddof=1) + eps)


def component_means(components, names) -> dict:
  """Each reward's batch mean as a metric: {"reward/<name>_mean": float}. components: (B, R)."""
  components = np.asarray(components, np.float64)
  names = list(names)
  if components.ndim != 2 or components.shape[1] != len(names):
    raise ValueError(f"components of shape {components.shape} do not match {len(names)} "
                     f"reward names {names}; expected (B, {len(names)}).")
  return {f"reward/{name}_mean": float(components[:, i].mean()) for i, name in enumerate(names)}
