"""The registry of off-policy corrections (rl.is_correction) and the clamp they share, apart
from corrections.py so that rejection.py's entries register without an import circle."""

from grpo_jax.registry import Registry

SAFETY_BOUND = 20.0  # |log ratio| clamp before exp (verl's SAFETY_BOUND)

# rl.is_correction: fn(behaviour_logp, proximal_logp, mask, *, hyperparameters) -> weights
IS_CORRECTIONS = Registry("rl.is_correction")
