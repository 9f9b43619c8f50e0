"""RoPE's inverse frequencies for each `rope_type` a config.json's `rope_parameters` names, as
transformers defines them (modeling_rope_utils.py): default, linear, dynamic, yarn and llama3.

A type is a registered function (its parameters, rope_theta, head_dim, max_position_embeddings)
-> (inverse frequencies (head_dim / 2,), attention factor), computed once on the host in float64
from the config alone. attention.rotary_embedding turns them into angles, position x inverse
frequency, and scales cos and sin by the factor (YaRN's; 1 elsewhere). ModelConfig holds the
type and its parameters (`rope_type`, `rope_scaling`), checked when it is built.

Decision on `dynamic` (NTK-aware scaling, transformers' "dynamic"): its base grows with the
current sequence length L once L exceeds max_position_embeddings, and equals the default
otherwise. Beyond that length the frequencies depend on how long the batch is at each call, so
the sampler's cached keys (rotated as the sequence grew) and the update's teacher-forced keys
(rotated at the full length) would differ, and the importance ratio would compare two
functions. train/run/setup.py already refuses prompt + completion positions beyond
max_position_embeddings, so within a run `dynamic` is exactly the default frequencies, as in
transformers, and a dynamic model without max_position_embeddings is refused.

To add a type, register it once:

    register_rope_type(RopeType("my_rope", required=("factor",), frequencies=my_fn))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np

# (parameters, rope_theta, head_dim, max_position_embeddings) -> (inv_freq, attention factor)
Frequencies = Callable[[Mapping[str, Any], float, int, int], tuple[np.ndarray, float]]


@dataclasses.dataclass(frozen=True)
class RopeType:
  """One rope_type: the parameters it needs and how they give the inverse frequencies."""

  name: str
  required: tuple[str, ...]
  frequencies: Frequencies
  needs_max_position: bool = False  # True: refused without max_position_embeddings


ROPE_TYPES: dict[str, RopeType] = {}


def register_rope_type(rope_type: RopeType) -> RopeType:
  ROPE_TYPES[rope_type.name] = rope_type
  return rope_type


def default_inverse_frequencies(theta: float, head_dim: int) -> np.ndarray:
  """inv_freq_i = theta^(-2i / D), i = 0 .. D/2 - 1."""
  return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def _default(params, theta, head_dim, max_position):
  return default_inverse_frequencies(theta, head_dim), 1.0


def _linear(params, theta, head_dim, max_position):
  """Position interpolation: inv_freq / factor (positions divided by `factor`)."""
  return default_inverse_frequencies(theta, head_dim) / params["factor"], 1.0


def _yarn(params, theta, head_dim, max_position):
  """YaRN (arXiv 2309.00071): per frequency a blend of interpolation (inv_freq / s) and
  extrapolation (inv_freq), by a linear ramp over the dimensions whose number of rotations over
  the original context lies between beta_slow and beta_fast:

      d(r) = D ln(L_orig / (2 pi r)) / (2 ln base),  low = floor(d(beta_fast)),
      high = ceil(d(beta_slow)) (no rounding when truncate is false), clipped to [0, D - 1];
      ramp_i = clip((i - low) / (high - low), 0, 1),  e_i = 1 - ramp_i;
      inv_freq_i = inv_freq_i / s * (1 - e_i) + inv_freq_i * e_i;
      attention factor = attention_factor, else mscale(s, mscale) / mscale(s, mscale_all_dim)
      when both are given, else mscale(s) = 0.1 ln s + 1 (1 for s <= 1).
  s = factor, or max_position_embeddings / original_max_position_embeddings when factor is null.
  """
  original = params["original_max_position_embeddings"]
  factor = params.get("factor") or max_position / original

  def mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

  attention = params.get("attention_factor")
  if attention is None:
    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
  beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
  dim_of = lambda rotations: (head_dim * math.log(original / (rotations * 2 * math.pi))  # noqa
                              / (2 * math.log(theta)))
  low, high = dim_of(beta_fast), dim_of(beta_slow)
  if params.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, head_dim - 1)
  if low == high:
    high += 0.001  # transformers' guard against a zero-width ramp
  ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
  extrapolate = 1.0 - ramp
  inv_freq = default_inverse_frequencies(theta, head_dim)
  return inv_freq / factor * (1.0 - extrapolate) + inv_freq * extrapolate, float(attention)


def _llama3(params, theta, head_dim, max_position):
  """Llama 3.1's scaling: with wavelength w = 2 pi / inv_freq and L = original context,
  w < L / high_freq_factor keeps inv_freq, w > L / low_freq_factor divides it by `factor`, and
  between the two it is smoothed: (1 - a) inv_freq / factor + a inv_freq,
  a = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)."""
  factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
  context = params["original_max_position_embeddings"]
  inv_freq = default_inverse_frequencies(theta, head_dim)
  wavelength = 2 * math.pi / inv_freq
  scaled = np.where(wavelength > context / low, inv_freq / factor, inv_freq)
  smooth = (context / wavelength - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelength >= context / high) & (wavelength <= context / low)
  return np.where(medium, smoothed, scaled), 1.0


register_rope_type(RopeType("default", (), _default))
register_rope_type(RopeType("linear", ("factor",), _linear))
# dynamic: NTK-aware scaling at L <= max_position_embeddings, the only lengths a run reaches
# (module docstring): base' = base * (factor * L / M - (factor - 1))^(D / (D - 2)) with L = M,
# i.e. base: the default frequencies.
register_rope_type(RopeType("dynamic", ("factor",), _default, needs_max_position=True))
register_rope_type(RopeType("yarn", ("original_max_position_embeddings",), _yarn))
register_rope_type(RopeType("llama3", ("factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"), _llama3))


def check_rope(rope_type: str, scaling: Mapping[str, Any], max_position: int) -> None:
  """Raises ValueError naming the value and the fix when the type or its parameters cannot be
  represented."""
  if rope_type not in ROPE_TYPES:
    raise ValueError(f"rope_type={rope_type!r} is not supported; use a checkpoint with one of "
                     f"{', '.join(sorted(ROPE_TYPES))}.")
  kind = ROPE_TYPES[rope_type]
  missing = [k for k in kind.required if scaling.get(k) is None]
  if missing:
    raise ValueError(f"rope_type={rope_type!r} needs {', '.join(missing)} in rope_parameters; "
                     f"use the config.json that came with the checkpoint.")
  partial = scaling.get("partial_rotary_factor", 1.0)
  if partial != 1.0:
    raise ValueError(f"rope_parameters partial_rotary_factor={partial} (RoPE on part of each "
                     f"head) is not supported; use a checkpoint that rotates whole heads.")
  if kind.needs_max_position and not max_position:
    raise ValueError(f"rope_type={rope_type!r} needs max_position_embeddings (its frequencies "
                     f"change past it); set max_position_embeddings in config.json.")
  if rope_type == "yarn" and not scaling.get("factor") and not max_position:
    raise ValueError("rope_type='yarn' without a factor takes it from max_position_embeddings "
                     "/ original_max_position_embeddings, and max_position_embeddings is not "
                     "set; give rope_parameters a factor or config.json max_position_embeddings.")


def rope_frequencies(rope_type: str, scaling: Mapping[str, Any], theta: float, head_dim: int,
                     max_position: int) -> tuple[np.ndarray, float]:
  """(inverse frequencies (head_dim / 2,) float32, attention factor) of a checked rope type."""
  inv_freq, factor = ROPE_TYPES[rope_type].frequencies(scaling, theta, head_dim, max_position)
  return np.asarray(inv_freq, np.float32), float(factor)


def llama3_parameters_from_factors(factors, theta: float, head_dim: int):
  """The llama3 rope_parameters whose per-frequency divisors (default / scaled inverse
  frequency) are `factors`, as llama.cpp stores them in a GGUF's rope_freqs tensor; None when
  no (factor = max divisor, low_freq_factor 1 or 2, high_freq_factor 2, 4 or 8, an original
  context of 2^4 .. 2^17) reproduces them within 1e-5. All ones: {} (default RoPE)."""
  factors = np.asarray(factors, np.float64)
  if factors.shape != (head_dim // 2,):
    return None
  if np.allclose(factors, 1.0, rtol=1e-6):
    return {}
  default = default_inverse_frequencies(theta, head_dim)
  for context in (8192, *(2 ** k for k in range(4, 18) if k != 13)):  # Llama 3.x's first
    for low in (1.0, 2.0):
      for high in (4.0, 8.0, 2.0):
        params = dict(factor=float(np.float32(factors.max())), low_freq_factor=low,
                      high_freq_factor=high, original_max_position_embeddings=context)
        scaled, _ = _llama3(params, theta, head_dim, 0)
        if np.allclose(default / scaled, factors, rtol=1e-5):
          return {"rope_type": "llama3", **params}
  return None


def rope_fields(hf_config: dict) -> dict:
  """ModelConfig's rope_theta, rope_type and rope_scaling from rope_parameters (transformers 5)
  or rope_theta / rope_scaling (older files); models/rope.py checks the type and parameters."""
  rope = dict(hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {})
  rope_type = rope.pop("rope_type", rope.pop("type", "default"))
  theta = float(rope.pop("rope_theta", hf_config.get("rope_theta", 10_000.0)))
  try:
    check_rope(rope_type, rope, int(hf_config.get("max_position_embeddings") or 0))
  except ValueError as err:
    raise ValueError(f"config.json {err}") from None
  return dict(rope_theta=theta, rope_type=rope_type, rope_scaling=tuple(sorted(rope.items())))
