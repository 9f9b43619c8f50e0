"""The sampler: one jitted, pure function from (params, prompts, key) to a `Rollout`
(`sample`, which also returns its `DecodeStats`; `generate`, the Rollout alone).

prefill (rollout/prefill.py: one forward pass over the left-padded prompts, filling the KV
cache), then the engine's (rollout/engine.py: static.py or refill.py) `lax.while_loop`s of
single-token decode steps that end when every row has emitted EOS or its completion limit. Shapes are static: prompts (B / G, P), completions (B, N), so one
compilation serves every call of the same shapes and settings; the settings are one hashable
`Sampling`, the compiled call's one static argument.

Prefix sharing: each prompt is prefilled once and its cache rows, last-position logits and
masks are repeated for its G samples (`group_size`), so prefill FLOPs scale with prompts, not
rows. Decode reads only what exists: the decode steps run in segments of `decode_block` steps,
and a segment's attention reads the first P + (its last step + 1) cache slots, not all P + N.
Neither changes a drawn token (tests/test_sampler_prefix.py). The KV cache is made inside the
one jitted call and carried through the loops, never an argument or a result, so XLA updates it
in place: there is no second copy to donate away (the cache's donation, in this form).

Tokens do not depend on scheduling: token t of row r (r = prompt x G + sample, the row's index
in the call's Rollout) is drawn with the uniform `token_uniforms(key, r, t)`, never with one
that depends on the batch, a slot or the loop. So the slot-refill engine (rollout/refill.py,
`decode_slots`: S slots, a finished row's slot takes the next pending row) draws the same
tokens as the static engine, with any S, any batch split and any mesh
(tests/test_refill.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax

from grpo_jax.models.vision.policy import vlm_prompt_inputs
from grpo_jax.parallel.mesh import sampler_rules
from grpo_jax.rollout import engine, refill, static  # noqa: F401 (refill, static: register)
from grpo_jax.rollout.prefill import repeat_rows
from grpo_jax.rollout.types import DecodeStats, Rollout, check_per_row, row_limits_or_max


class Sampling(engine.Settings):
  """engine.Settings with the call that runs them: `sampling(params, prompts,
  mask, key)` -> Rollout, `with_stats` -> (Rollout, DecodeStats)."""

  def __call__(self, params, prompt_tokens, prompt_mask, key, images=None) -> Rollout:
    """generate(params, prompt_tokens, prompt_mask, key) with these settings: prompts
    (B / G, P) -> a Rollout of B rows."""
    return self.with_stats(params, prompt_tokens, prompt_mask, key, images=images)[0]

  def with_stats(self, params, prompt_tokens, prompt_mask, key, row_limits=None,
                 row_ids=None, images=None):
    """sample(...) with these settings: (Rollout, DecodeStats). images (B / G, patches, dim):
    each prompt's image, for a vision-language model (model_cfg a VlmConfig; the prompts'
    inputs: models/vision/policy.py; None: text prompts). row_ids (B,) int32: the r of
    each row's draws, token_uniforms(key, r, t) (None: its index in the call; a multi-turn
    source passes episode ids, so an episode's tokens do not depend on its batch). Called
    outside a jit, it runs under its own mesh (a sampler on devices of its own,
    mesh.rollout_devices, called inside the learner's `jax.set_mesh`), its key and row
    arrays copied onto that mesh when they live on other devices."""
    own = self.mesh is not None and not isinstance(prompt_tokens, jax.core.Tracer)
    if own:
      key, row_limits, row_ids = (_onto(self.mesh, x) for x in (key, row_limits, row_ids))
    with jax.set_mesh(self.mesh) if own else contextlib.nullcontext():
      return _sample(params, prompt_tokens, prompt_mask, key, row_limits, row_ids, images,
                     sampling=self)


def _onto(mesh, x):
  """x replicated on `mesh` when it is a device array on other devices; else x itself."""
  if not isinstance(x, jax.Array) or x.sharding.device_set <= set(mesh.devices.flat):
    return x
  return jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


@functools.partial(jax.jit, static_argnames=("sampling",))
def _sample(params, prompt_tokens, prompt_mask, key, row_limits, row_ids=None, images=None,
            inputs=None, *, sampling: Sampling) -> tuple[Rollout, DecodeStats]:
  """The engines' one entry: images (a vision-language policy's, model_cfg a VlmConfig) become
  the prompts' PromptInputs here, and every engine runs its decoder on them; inputs: given
  PromptInputs (model_cfg the decoder's)."""
  with sampler_rules():  # decode: rows over data x fsdp x expert x context (not tokens)
    s = sampling
    if images is not None:  # image + text prompts: the decoder's params and the prompts' inputs
      params, inputs = vlm_prompt_inputs(params, prompt_tokens, prompt_mask.astype(bool), images,
                                         s.model_cfg)
      s = dataclasses.replace(s, model_cfg=s.model_cfg.text)
    engine.refuse([s.engine], [f for f in ("keep_mask", "record_routes", "weight_dtype")
                               if getattr(s, f)] + ["images"] * (inputs is not None))
    params = engine.read_params(params, s)
    rows = prompt_tokens.shape[0] * s.group_size
    check_per_row(rows, row_ids=row_ids, row_limits=row_limits)  # shapes: at trace time
    limits = row_limits_or_max(row_limits, rows, s.max_new_tokens)
    rollout, stats = engine.GENERATE[s.engine](params, prompt_tokens, prompt_mask, key, limits,
                                                sampling=s, row_ids=row_ids, inputs=inputs)
    if images is not None:  # each row's image (its prompt's) reaches the update's passes
      rollout = rollout._replace(images=repeat_rows(images, s.group_size))
    return rollout, stats


def sample(params, prompt_tokens, prompt_mask, key, row_limits=None,
           **settings) -> tuple[Rollout, DecodeStats]:
  """Samples up to `max_new_tokens` tokens (row r: up to row_limits[r]) for group_size rows per
  left-padded prompt row; returns (Rollout, DecodeStats). `settings` are the fields of
  `Sampling` (model_cfg, max_new_tokens, eos_id and pad_id required), the one jit-static
  argument of the compiled call.

  prompt_tokens (B / G, P); the Rollout has B = prompts x G rows, groups contiguous, its
  prompts repeated. decode_slots > 0 runs the slot-refill engine, else the static one: the
  same tokens and masks (module docstring).
  """
  return Sampling(**settings).with_stats(params, prompt_tokens, prompt_mask, key, row_limits)


def generate(params, prompt_tokens, prompt_mask, key, row_limits=None, **settings) -> Rollout:
  """`sample`'s Rollout alone (the same arguments)."""
  return sample(params, prompt_tokens, prompt_mask, key, row_limits, **settings)[0]
