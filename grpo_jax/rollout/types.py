"""What the sampler returns, shared by its engines (rollout/engine.py) and
by everything that consumes rollouts: `Rollout`, `DecodeStats`, and the helpers that build
them."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.errors import ConfigError


class Rollout(NamedTuple):
  """Completions of B = prompts x G rows (groups contiguous)."""
  prompt_tokens: jax.Array  # (B, P) int32, left-padded
  prompt_mask: jax.Array  # (B, P) bool
  completion_tokens: jax.Array  # (B, N) int32, pad after EOS
  completion_mask: jax.Array  # (B, N) bool, True up to and including EOS
  logprobs: jax.Array  # (B, N) float32, log pi_sample(token), 0 where masked
  truncated: jax.Array  # (B,) bool, hit N tokens without EOS
  # (B, N) bool: the completion tokens the policy chose, the ones that carry loss. The
  # sampler's rows: completion_mask. A multi-turn source sets the tokens it inserted (tool
  # output, an environment's turns) False: they condition the policy but are not its actions.
  action_mask: jax.Array
  # The keep-sampling mask (rl.keep_sampling_mask; rollout/sampling.py keep_record), None when
  # not recorded: (B, N) float32 each, 0 where masked. keep_cutoff: the sampling policy's
  # log-prob of the least likely token top-k / top-p left available at that position (the
  # available set is every token at least that likely); kept_logmass: log of their total mass.
  keep_cutoff: jax.Array | None = None
  kept_logmass: jax.Array | None = None
  # A mixture of experts' routing as the sampler chose it (Sampling.record_routes), None when
  # not recorded: (B, P + N, L, k) int32, the experts of every prompt and completion token in
  # every layer (0 where a token was never run: padding after EOS, the last token). The
  # update's forward passes replay it under rl.routing_replay = "rollout".
  routes: jax.Array | None = None
  # (B,) int32: the policy version (the learner's step) that sampled each row, set by the
  # experience source (train/sources/experience_source.py); None straight from the sampler.
  version: jax.Array | None = None
  # (B, patches, C*T*P*P) float32: each row's image (its prompt's), as the image processor
  # gives it, for a vision-language policy (models/vision/policy.py); None for text prompts.
  # The update's and the reference's passes read it: the image reaches every pass.
  images: jax.Array | None = None


class DecodeStats(NamedTuple):
  """How much decode work a sampler call spent: slot_steps = decode slots x loop iterations
  (an iteration records at most one token per slot), so useful tokens / slot_steps is the
  decode-slot utilisation."""
  slot_steps: jax.Array  # () int32


def check_per_row(rows: int, **arrays) -> None:
  """ConfigError when a per-row array (row_ids, row_limits) is not of shape (rows,): a shorter
  one was broadcast or gathered past its end (rows sharing one row's draws), silently."""
  for name, x in arrays.items():
    if x is not None and jnp.shape(x) != (rows,):
      raise ConfigError(f"{name} has shape {jnp.shape(x)}, the call samples {rows} rows "
                        f"(prompts x group_size); pass one per row or None.")


def row_limits_or_max(row_limits, rows: int, max_new_tokens: int) -> jax.Array:
  """(rows,) int32 per-row completion limits in [1, N] (N for every row when None)."""
  if row_limits is None:
    return jnp.full((rows,), max_new_tokens, jnp.int32)
  return jnp.clip(jnp.asarray(row_limits, jnp.int32), 1, max_new_tokens)


def finish(prompt_tokens, prompt_mask, recorded, eos_id: int, prompt_routes=None) -> Rollout:
  """The Rollout of a decode loop's `recorded` outputs (rollout/engine.Recorded): truncated = the
  row ended without emitting EOS; every recorded token is the policy's (action_mask = the
  completion mask); routes = the prompt's experts (B, P, L, k) then the completion's, when
  prompt_routes is given."""
  ended_by_eos = jnp.any((recorded.tokens == eos_id) & recorded.mask, axis=1)
  cutoff, logmass = (None, None) if recorded.kept is None else recorded.kept
  routes = (None if prompt_routes is None
            else jnp.concatenate([prompt_routes, recorded.routes], axis=1))
  return Rollout(prompt_tokens, prompt_mask, recorded.tokens, recorded.mask, recorded.logprobs,
                 ~ended_by_eos, recorded.mask, cutoff, logmass, routes)
