"""The sampler: one jitted, pure function from (params, prompts, key) to a `Rollout`
(`sample`, which also returns its `DecodeStats`; `generate`, the Rollout alone).

prefill (rollout/prefill.py: one forward pass over the left-padded prompts, filling the KV
cache), then (rollout/static.py) `lax.while_loop`s of single-token decode steps that end when every row has emitted EOS or the
completion limit is reached. Shapes are static: prompts (B / G, P), completions (B, N), so one
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
from typing import Any

import jax

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.layout import compute_copy, split_layers
from grpo_jax.models.quantized import quantize_layers
from grpo_jax.models.vision.policy import vlm_prompt_inputs
from grpo_jax.parallel.choices import choose
from grpo_jax.rollout.prefill import repeat_rows
from grpo_jax.rollout.refill import generate_refill
from grpo_jax.rollout.static import generate_static
from grpo_jax.rollout.types import DecodeStats, Rollout, row_limits_or_max


@dataclasses.dataclass(frozen=True)
class Sampling:
  """What a sampler call needs besides params, prompts and key: the model, the lengths and
  special tokens, the sampling policy, and the mesh (hashable: a jit-static value)."""
  model_cfg: ModelConfig
  max_new_tokens: int
  eos_id: int
  pad_id: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  mesh: Any = None
  group_size: int = 1  # sample rows per prompt row (prefix sharing)
  decode_block: int = 0  # decode steps per segment; <= 0: one segment reading all slots
  decode_slots: int = 0  # slot-refill engine with min(this, rows) slots; 0: static
  decode_loop: str = "auto"  # the static engine's (static.DECODE_LOOPS); auto: platform table
  # Record each token's top-k / top-p truncation (Rollout.keep_cutoff, kept_logmass) for the
  # keep-sampling mask (rl.keep_sampling_mask); the tokens and log-probs do not change.
  keep_mask: bool = False
  # Record a mixture of experts' routing (Rollout.routes) for routing replay and its mismatch
  # metric (rl.routing_replay); the static engine records it.
  record_routes: bool = False
  # rollout.weight_dtype: the sampler reads the layers' kernels quantised to this dtype
  # ("int8"; models/quantized.py), a copy made inside the call; "" = the params as given.
  weight_dtype: str = ""

  @classmethod
  def of(cls, model_cfg: ModelConfig, task, rollout_cfg, mesh=None,
         max_new_tokens: int | None = None) -> "Sampling":
    """The rollout's sampling for a task (its eos / pad) and a config's rollout section, one
    row per prompt row (`grouped` for G)."""
    return cls(model_cfg, max_new_tokens or rollout_cfg.max_new_tokens, task.eos_id,
               task.pad_id, rollout_cfg.temperature, rollout_cfg.top_k, rollout_cfg.top_p,
               mesh, 1, getattr(rollout_cfg, "decode_block", 0),
               getattr(rollout_cfg, "decode_slots", 0),
               decode_loop=getattr(rollout_cfg, "decode_loop", "auto"))

  def greedy(self) -> "Sampling":
    """Greedy, one row per prompt."""
    return dataclasses.replace(self, temperature=0.0, top_k=0, top_p=1.0, group_size=1)

  def grouped(self, group_size: int, keep_mask: bool = False,
              record_routes: bool = False) -> "Sampling":
    """group_size sampled rows per prompt row, the prompt prefilled once; keep_mask: record
    the truncation of each token (the training rollout under rl.keep_sampling_mask);
    record_routes: record a mixture's routing (the training rollout of an MoE model)."""
    return dataclasses.replace(self, group_size=group_size, keep_mask=keep_mask,
                               record_routes=record_routes and bool(self.model_cfg.num_experts))

  def quantized(self, weight_dtype: str) -> "Sampling":
    """The sampler reading a `weight_dtype` copy of the layers' kernels ("": full precision):
    the training rollout under rollout.weight_dtype."""
    return dataclasses.replace(self, weight_dtype=weight_dtype)

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
  s, model_cfg = sampling, sampling.model_cfg
  if images is not None:  # image + text prompts: the decoder's params and the prompts' inputs
    params, inputs = vlm_prompt_inputs(params, prompt_tokens, prompt_mask.astype(bool), images,
                                       model_cfg)
    model_cfg = model_cfg.text
  if s.weight_dtype:  # the quantised copy the decode steps read (models/quantized.py)
    params = quantize_layers(params, s.weight_dtype)
  else:  # matrices in the compute dtype once, not cast in every decode step
    params = compute_copy(params, model_cfg.dtype)
  # Stacked layers sliced once here, not in every decode step (models/layout.split_layers).
  params = split_layers(params, model_cfg.num_layers)
  rows = prompt_tokens.shape[0] * s.group_size
  limits = row_limits_or_max(row_limits, rows, s.max_new_tokens)
  common = dict(model_cfg=model_cfg, max_new_tokens=s.max_new_tokens,
                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, eos_id=s.eos_id,
                pad_id=s.pad_id, mesh=s.mesh, group_size=s.group_size, keep_mask=s.keep_mask,
                row_ids=row_ids, inputs=inputs)
  if s.decode_slots > 0:
    if s.record_routes:
      raise ValueError(f"rollout.decode_slots={s.decode_slots} (the slot-refill engine) does "
                       f"not record a mixture's routing; set rollout.decode_slots=0 for an "
                       f"MoE model's training rollouts.")
    rollout, stats = generate_refill(params, prompt_tokens, prompt_mask, key, limits,
                                     decode_slots=min(s.decode_slots, rows), **common)
  else:
    rollout, stats = generate_static(
        params, prompt_tokens, prompt_mask, key, limits, decode_block=s.decode_block,
        record_routes=s.record_routes,
        decode_loop=choose("rollout.decode_loop", s.decode_loop), **common)
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
  prompts repeated. Token t of row r is drawn with `token_uniforms(key, r, t)`, whichever
  engine runs: decode_slots > 0 runs the slot-refill engine (rollout/refill.py: min(S, B) slots,
  a finished row's slot takes the next pending row), else the static one (rollout/static.py:
  every row decoded until the last one ends). Both give the same tokens and masks.
  """
  return Sampling(**settings).with_stats(params, prompt_tokens, prompt_mask, key, row_limits)


def generate(params, prompt_tokens, prompt_mask, key, row_limits=None, **settings) -> Rollout:
  """`sample`'s Rollout alone (the same arguments)."""
  return sample(params, prompt_tokens, prompt_mask, key, row_limits, **settings)[0]
