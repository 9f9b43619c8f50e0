"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (float32): the
loss, the gradients and the per-token log-probs of GRPO, PPO with a value head, DPO and packed
rows on meshes with a `context` axis (each row's tokens split over it) against one device, and
the sampler's prefill over split tokens (its tokens, memory, the TPU kernel); prints one JSON
line of the largest absolute differences (tests/test_context.py)."""

import contextlib
import dataclasses
import functools
import json
import re
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from grpo_jax.defaults import rl_defaults
from grpo_jax.models.attention import attention_mask, grouped_query_attention
from grpo_jax.models.context import (from_layout, in_layout, layout_mask, layout_order,
                                     tpu_splash_context_attention)
from grpo_jax.models.partitioning import shardings
from grpo_jax.models.scoring import completion_scores
from grpo_jax.models.value_head import init_value_params
from grpo_jax.parallel.mesh import make_mesh, mesh_config, shard_batch
from grpo_jax.rl.aggregation import loss_normalizer
from grpo_jax.rl.dpo import PairLogps, dpo
from grpo_jax.rollout.sampler import Sampling, generate
from grpo_jax.train.learner.experience import RewardInputs, make_prepare_batch
from grpo_jax.train.learner.forward import policy_and_values
from grpo_jax.train.learner.state import create_train_state, make_optimizer
from grpo_jax.train.learner.update import loss_and_sums
from tests.fixtures import perturbed_params, tiny_model_config

CFG = tiny_model_config(vocab_size=16)
OPTIM = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=1, weight_decay=0.0,
                                       b1=0.9, b2=0.99, max_grad_norm=1.0))
# 4 prompts of 4 slots (left-padded) x G = 4, 7 new tokens: rows of 11 tokens, which the
# decoder pads to 12 to split them over context = 2 and 4.
PROMPTS = np.repeat(np.array([[1, 5, 6, 3], [0, 1, 9, 4], [0, 0, 1, 3], [1, 12, 11, 7]],
                             np.int32), 4, 0)
NEW = 7
# (data, fsdp, tensor, expert, context)
MESHES = {"context=4": (2, 1, 1, 1, 4), "(fsdp, tensor, context)=(2, 2, 2)": (1, 2, 2, 1, 2)}
OBJECTIVES = {
    "grpo": dict(rl=dict(kl_coef=0.05)),
    "ppo_value_head": dict(rl=dict(advantage="gae", value_head="shared", kl_coef=0.05)),
    "packed": dict(rl=dict(kl_coef=0.05, pack_tokens=64), capacity=64),
    # the vocabulary reached 4 positions at a time (model.logits_chunk)
    "chunked": dict(rl=dict(kl_coef=0.05), logits_chunk=4),
    # the tokens in the zig-zag layout (rows padded to 16 and 12), with a value head
    "zigzag": dict(rl=dict(advantage="gae", value_head="shared", kl_coef=0.05),
                   context_layout="zigzag"),
}


@functools.cache
def host_params():
  """perturbed_params(CFG), made once and kept on the host: each part places its own copy."""
  return jax.device_get(perturbed_params(CFG))


def model_of(name: str):
  spec = OBJECTIVES[name]
  return dataclasses.replace(CFG, logits_chunk=spec.get("logits_chunk", 0),
                             context_layout=spec.get("context_layout", "contiguous"))


def rollout_batch():
  r = generate(host_params(), PROMPTS, PROMPTS != 0, jax.random.key(3), model_cfg=CFG,
               max_new_tokens=NEW, temperature=1.0, eos_id=2, pad_id=0)
  rewards = (np.asarray(r.completion_tokens) == 7).sum(1).astype(np.float32)
  return jax.device_get(r), jax.device_get(RewardInputs(jnp.asarray(rewards), {}, jnp.int32(0)))


def prepared(name, batch_inputs):
  """(rl, the state, the prepared Batch) of one objective, on one device."""
  spec = OBJECTIVES[name]
  rl = rl_defaults(**spec["rl"])
  params = host_params()
  value_params = init_value_params(rl.value_head, CFG, params, jax.random.key(2))
  if value_params is not None:  # a head that reads the hidden states
    value_params = jax.tree.map(lambda x: x + 0.1, value_params)
  state = create_train_state(params, make_optimizer(OPTIM, 10), jax.random.key(1),
                             value_params, rl.kl_coef)
  batch, _ = jax.jit(make_prepare_batch(model_of(name), rl, 4, 1.0, NEW, spec.get("capacity")))(
      state, *batch_inputs)
  return rl, jax.device_get(state), jax.device_get(batch)


def rl_figures(name, mesh, job):
  """(loss, gradients, per-token log-probs, values or None) of one objective under `mesh`,
  in one program."""
  rl, state, batch = job
  capacity, cfg = OBJECTIVES[name].get("capacity"), model_of(name)
  with jax.set_mesh(mesh):
    state = jax.device_put(state, shardings(state, mesh))
    batch = shard_batch(batch, mesh)

    def loss(trainable):
      value = loss_and_sums(trainable, batch, loss_normalizer(batch.loss_mask,
                                                              rl.loss_aggregation),
                            state.kl_coef, model_cfg=cfg, rl=rl, temperature=1.0,
                            token_capacity=capacity)[0]
      logp, _, values, _ = policy_and_values(*trainable, batch, cfg, rl.value_head, 1.0, 1,
                                             capacity)
      return value, (logp, values)
    (value, (logp, values)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
        (state.params, state.value_params))
    return jax.device_get((value, grads, logp, values))


def tpu_lowering(mesh, job) -> dict:
  """GRPO's loss and gradients lowered for TPU on `mesh` with the TPU row of the platform
  table (bfloat16, the Pallas kernels, the zig-zag layout): which Pallas kernels its module
  calls (their names in the tpu_custom_calls' configs), and how many calls."""
  rl, state, batch = job
  cfg = dataclasses.replace(CFG, compute_dtype="bfloat16", attention_impl="pallas",
                            context_layout="zigzag")
  with jax.set_mesh(mesh):
    state, batch = jax.device_put(state, shardings(state, mesh)), shard_batch(batch, mesh)
    loss = lambda p: loss_and_sums(  # noqa: E731
        p, batch, loss_normalizer(batch.loss_mask, rl.loss_aggregation), state.kl_coef,
        model_cfg=cfg, rl=rl, temperature=1.0)[0]
    text = jax.jit(jax.grad(loss)).trace((state.params, None)).lower(
        lowering_platforms=("tpu",)).as_text()
  names = sorted(set(re.findall(r'(splash_\w+|flash_\w+)', text)))
  # The sampler on the same mesh: 4 prompts of 512 tokens (4 x 128 per device), G = 2.
  sampling = Sampling(cfg, NEW, eos_id=2, pad_id=0, temperature=1.0, mesh=mesh,
                      decode_loop="bounded").grouped(2)
  params = jax.eval_shape(lambda: perturbed_params(cfg))
  prompts = jax.ShapeDtypeStruct((4, 512), jnp.int32)
  with jax.set_mesh(mesh):
    sampler = jax.jit(lambda p, t: sampling.with_stats(p, t, t != 0, jax.random.key(0))).trace(
        params, prompts).lower(lowering_platforms=("tpu",)).as_text()
  return dict(custom_calls=text.count("tpu_custom_call"), kernels=names,
              sampler_custom_calls=sampler.count("tpu_custom_call"),
              sampler_kernels=sorted(set(re.findall(r'(splash_\w+|flash_\w+)', sampler))))


SPLASH_SHAPE = (2, 512, 4, 2, 128)  # batch, length, heads, kv_heads, dim


@jax.jit
def splash_inputs():
  """q, k, v and the keys' mask of splash_figures: rows of 512 tokens (4 devices x one
  128-token block), one left-padded by 37 and one right-padded by 12."""
  batch, length, heads, kv_heads, dim = SPLASH_SHAPE
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (batch, length, heads, dim))
  k, v = (jax.random.normal(key, (batch, kv_heads, length, dim)) for key in keys[1:])
  slots = jnp.arange(length)[None]
  return q, k, v, (slots >= jnp.array([[0], [37]])) & (slots < jnp.array([[500], [length]]))


@functools.partial(jax.jit, static_argnames="layout")
def splash_outputs(q, k, v, kv_mask, layout=None):
  """The real queries' outputs and the gradients of sum(sin(out)) over them (q, k, v in slot
  order): one device's grouped_query_attention (layout None), or the TPU path's splash kernel
  over the mesh's split rows, its inputs put in the layout's order and its figures back."""
  length = q.shape[1]
  real = kv_mask[:, :, None, None].astype(jnp.float32)
  if layout is None:
    mask = attention_mask(kv_mask, length, 0)
    attend = lambda q, k, v: grouped_query_attention(q, k, v, mask)  # noqa: E731
    order = None
  else:
    order = layout_order(length, 4, layout)
    mask = attention_mask(kv_mask, length, 0) if order is None else layout_mask(kv_mask, order)
    attend = lambda q, k, v: tpu_splash_context_attention(  # noqa: E731
        q, k, v, mask, layout, interpret=True)
  real_placed = in_layout(real, order, 1)

  def both(q, k, v):
    out = attend(q, k, v)
    return jnp.sum(jnp.sin(out) * real_placed), out
  placed = [in_layout(q, order, 1), in_layout(k, order, 2), in_layout(v, order, 2)]
  (_, out), grads = jax.value_and_grad(both, argnums=(0, 1, 2), has_aux=True)(*placed)
  return (from_layout(out, order, 1) * real,
          tuple(from_layout(g, order, axis) for g, axis in zip(grads, (1, 2, 2))))


def splash_figures(mesh) -> dict:
  """The TPU path's attention over split rows (context.tpu_splash_context_attention: jax's
  splash kernel, here run by Pallas's interpreter) against one device's
  grouped_query_attention, for both layouts: the largest differences of the real queries'
  outputs and of the gradients of sum(sin(out)) over them (splash_inputs' rows). Each is one
  compiled program (op by op, a hundred-odd eager ops were each compiled)."""
  q, k, v, kv_mask = splash_inputs()
  want = splash_outputs(q, k, v, kv_mask)
  out = {}
  for layout in ("contiguous", "zigzag"):
    with jax.set_mesh(mesh):
      got = splash_outputs(q, k, v, kv_mask, layout=layout)
    out[layout] = dict(out=diff(got[0], want[0]), grads=diff(got[1], want[1]),
                       grads_scale=max(float(jnp.max(jnp.abs(g))) for g in want[1]))
  return out


def splash_prefill_figures(devices) -> dict:
  """The sampler's prefill on context = 4 with the TPU path's attention (the splash kernel,
  run by Pallas's interpreter; its tokens split by mesh.prefill_rules) against one device's
  XLA prefill: 2 prompts of 512 tokens, one left-padded by 100, G = 2. The largest
  differences of the last position's logits and of the cache's real slots (a padding slot's
  keys are never read: its query sees other keys than on one device)."""
  from grpo_jax.models import decoder  # noqa: PLC0415
  from grpo_jax.parallel.mesh import sampler_rules  # noqa: PLC0415
  from grpo_jax.rollout.prefill import prefill  # noqa: PLC0415
  length = 512
  tokens = np.random.default_rng(0).integers(3, 16, size=(2, length)).astype(np.int32)
  tokens[0, :100] = 0
  kv_mask = tokens != 0
  params = host_params()
  run = lambda cfg, mesh, p: jax.device_get(jax.jit(lambda p: prefill(  # noqa: E731
      p, tokens, kv_mask, model_cfg=cfg, max_new_tokens=4, mesh=mesh, group_size=2,
      shared_prompt=True))(p))
  want = run(CFG, None, params)
  mesh = make_mesh(mesh_config(1, 1, 1, 1, 4), devices[:4])
  kernel = decoder.tpu_splash_context_attention
  decoder.tpu_splash_context_attention = lambda *a: kernel(*a, interpret=True)
  try:
    with jax.set_mesh(mesh), sampler_rules():
      got = run(dataclasses.replace(CFG, attention_impl="pallas"), mesh,
                jax.device_put(params, shardings(params, mesh)))
  finally:
    decoder.tpu_splash_context_attention = kernel
  real = {"prompt_kt": kv_mask[:, None, None, :], "prompt_v": kv_mask[:, None, :, None]}
  cache = max(float(np.max(np.abs(np.asarray(g[name]) - np.asarray(w[name])) * real[name]))
              for g, w in zip(got[1], want[1]) for name in real)
  return dict(logits=diff(got[0], want[0]), cache=cache)


def dpo_figures(mesh, rollout):
  """DPO's loss and gradients on pairs (row 2i chosen, 2i + 1 rejected), with the summed
  log-probs from the teacher-forced pass, and its per-token log-probs."""
  # (the params made off the mesh: eager ops under jax.set_mesh compile for it, one by one)
  params = host_params()
  ref = jax.tree.map(lambda x: x * 0.9, params)
  with jax.set_mesh(mesh):
    params, ref = (jax.device_put(p, shardings(p, mesh)) for p in (params, ref))
    seqs = shard_batch(rollout, mesh)

    def sums(p, seqs):
      logp = completion_scores(p, CFG, seqs)[0] * seqs.completion_mask
      return logp, logp.sum(1)

    def loss(p, ref, seqs):  # (ref and seqs as arguments: constants would be folded by XLA)
      (logp, s), (_, r) = sums(p, seqs), sums(ref, seqs)
      tokens = seqs.completion_mask.astype(jnp.float32).sum(1)
      return dpo(PairLogps(s[0::2], s[1::2], tokens[0::2], tokens[1::2], r[0::2], r[1::2])), logp
    (value, logp), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, ref, seqs)
    return jax.device_get((value, grads, logp, None))


def _temp_bytes(devices, program, rules=None) -> dict:
  """program(cfg, mesh)(params, tokens, mask)'s temporary bytes per device for one 2,048-token
  row (abstract, compiled only): on one device, and on context = 4, traced under `rules` (a
  context manager; None: the learner's)."""
  cfg = tiny_model_config(vocab_size=16, hidden_size=64, num_heads=8, num_kv_heads=2,
                          head_dim=16)
  params = jax.eval_shape(lambda: perturbed_params(cfg))
  tokens = jax.ShapeDtypeStruct((1, 2048), jnp.int32)
  mask = jax.ShapeDtypeStruct((1, 2048), jnp.bool_)

  def temp(mesh):
    with jax.set_mesh(mesh), rules() if rules else contextlib.nullcontext():
      p = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params,
                       shardings(params, mesh))
      f = jax.jit(program(cfg, mesh))
      return f.lower(p, tokens, mask).compile().memory_analysis().temp_size_in_bytes
  return {"one_device": temp(make_mesh(mesh_config(1, 1, 1, 1, 1), devices[:1])),
          "context=4": temp(make_mesh(mesh_config(1, 1, 1, 1, 4), devices[:4]))}


def split_memory(devices):
  """The teacher-forced pass of one 2,048-token row: one device against its tokens over
  context = 4."""
  from grpo_jax.models.decoder import decoder_apply, positions_from_mask  # noqa: PLC0415
  return _temp_bytes(devices, lambda cfg, mesh: lambda p, t, m: decoder_apply(
      cfg, p, t, positions_from_mask(m), m)[0])


def prefill_memory(devices):
  """The sampler's prefill of one 2,048-token prompt: one device against context = 4, where
  its tokens split (one prompt cannot split over rows)."""
  from grpo_jax.parallel.mesh import sampler_rules  # noqa: PLC0415
  from grpo_jax.rollout.prefill import prefill  # noqa: PLC0415
  return _temp_bytes(devices, lambda cfg, mesh: lambda p, t, m: prefill(
      p, t, m, model_cfg=cfg, max_new_tokens=8, mesh=mesh), sampler_rules)


def sampler_figures(devices) -> dict:
  """The sampler on (data, context) = (2, 4): its prefill splits each prompt's 4 tokens over
  context, its decode loop takes rows over data x context; the same tokens as one device's."""
  params = host_params()
  kw = dict(model_cfg=CFG, max_new_tokens=NEW, temperature=1.0, eos_id=2, pad_id=0,
            group_size=2)
  one = generate(params, PROMPTS[::2], PROMPTS[::2] != 0, jax.random.key(5), **kw)
  mesh = make_mesh(mesh_config(2, 1, 1, 1, 4), devices)
  with jax.set_mesh(mesh):
    placed = jax.device_put(params, shardings(params, mesh))
    prompts, mask = shard_batch((PROMPTS[::2], PROMPTS[::2] != 0), mesh)
    got = generate(placed, prompts, mask, jax.random.key(5), mesh=mesh, **kw)
  tokens = got.completion_tokens
  return dict(tokens_equal=bool(np.array_equal(np.asarray(tokens),
                                               np.asarray(one.completion_tokens))),
              rows_per_device=int(tokens.sharding.shard_shape(tokens.shape)[0]),
              rows=int(tokens.shape[0]))


def diff(a, b) -> float:
  leaves = [(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
  return max((float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in leaves),
             default=0.0)


def main():
  devices = jax.devices()
  assert len(devices) == 8, devices
  batch_inputs = rollout_batch()
  single = make_mesh(mesh_config(1, 1, 1, 1, 1), devices[:1])
  out = {}
  jobs = {}
  for name in (*OBJECTIVES, "dpo"):
    job = jobs[name] = batch_inputs[0] if name == "dpo" else prepared(name, batch_inputs)
    run = lambda mesh: (dpo_figures(mesh, job) if name == "dpo" else  # noqa: E731
                        rl_figures(name, mesh, job))  # noqa: B023
    ref = run(single)
    out[name] = {"grad_norm": float(np.sqrt(sum(np.sum(np.square(g))
                                                for g in jax.tree.leaves(ref[1]))))}
    for label, shape in MESHES.items():
      got = run(make_mesh(mesh_config(*shape), devices))
      out[name][label] = dict(loss=diff(got[0], ref[0]), grads=diff(got[1], ref[1]),
                              logprobs=diff(got[2], ref[2]), values=diff(got[3], ref[3]))
  out["splash"] = splash_figures(make_mesh(mesh_config(*MESHES["context=4"]), devices))
  out["tpu_lowering"] = tpu_lowering(make_mesh(mesh_config(*MESHES["context=4"]), devices),
                                     jobs["grpo"])
  out["temp_bytes"] = split_memory(devices)
  out["sampler"] = sampler_figures(devices)
  out["prefill_temp_bytes"] = prefill_memory(devices)
  out["splash_prefill"] = splash_prefill_figures(devices)
  print(json.dumps(out))


if __name__ == "__main__":
  sys.exit(main())
