"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8: compares the
sampler and the update on several meshes with the single-device run, each under `jax.set_mesh`
as the training loop runs them (so the decoder's activation constraints apply); prints one
JSON line."""

import functools
import json
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from grpo_jax.defaults import rl_defaults
from grpo_jax.models.partitioning import shardings
from grpo_jax.parallel.mesh import make_mesh, mesh_config, shard_batch
from grpo_jax.rollout.prefill import prefill
from grpo_jax.rollout.sampler import Sampling, generate
from grpo_jax.train.learner.experience import RewardInputs, make_prepare_batch
from grpo_jax.train.learner.state import create_train_state, make_optimizer
from grpo_jax.train.learner.update import make_update_step
from tests.fixtures import perturbed_params, tiny_model_config

CFG = tiny_model_config(vocab_size=16)
OPTIM = ml_collections.ConfigDict(dict(learning_rate=1e-2, warmup_steps=1, weight_decay=0.0,
                                       b1=0.9, b2=0.99, max_grad_norm=1.0))
PROMPTS = np.repeat(np.array([[1, 5, 6], [1, 9, 4], [0, 1, 3], [1, 12, 11]], np.int32), 4, 0)
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 2, 4)]


def mesh_of(shape, devices):
  return make_mesh(mesh_config(*shape), devices)


def two_updates(state, cfg, rl, optimizer, batch_inputs, mesh):
  """Two RL updates (preparation, then the update) of `state` on one fixed rollout batch, the
  batch placed on `mesh`: (state, the last update's metrics)."""
  prepare = jax.jit(make_prepare_batch(cfg, rl, 4, 1.0, 6))
  update = make_update_step(cfg, rl, optimizer, 1.0, group_size=4)
  rollout, inputs = shard_batch(batch_inputs, mesh)
  for _ in range(2):
    batch, _ = prepare(state, rollout, inputs)
    state, metrics = update(state, batch)
  return state, metrics


def run_on(mesh, batch_inputs, micro=1, shared=False, sample=True):
  """sample=False: only the updates (the runs whose tokens and cache are not compared; CI
  time). The state is made off the mesh and placed on it: eager ops under jax.set_mesh
  compile for the mesh one by one (seconds per run)."""
  rl = rl_defaults(num_minibatches=2, num_micro_batches=micro, kl_coef=0.05,
                   shared_prompt_forward=shared)
  optimizer = make_optimizer(OPTIM, 10)
  state = create_train_state(perturbed_params(CFG), optimizer, jax.random.key(1), None,
                             rl.kl_coef)
  with jax.set_mesh(mesh):
    return _run_on(mesh, batch_inputs, state, rl, optimizer, sample)


def _run_on(mesh, batch_inputs, state, rl, optimizer, sample):
  cfg = CFG
  state = jax.device_put(state, shardings(state, mesh))
  prompts, mask = shard_batch((PROMPTS, PROMPTS != 0), mesh)
  kw = dict(model_cfg=cfg, max_new_tokens=6, eos_id=2, pad_id=0, mesh=mesh)
  greedy = sampled = cache_shard = None
  if sample:
    greedy = generate(state.params, prompts, mask, jax.random.key(0), temperature=0.0, **kw)
    sampled = generate(state.params, prompts, mask, jax.random.key(3), temperature=1.0, **kw)
  state, metrics = two_updates(state, cfg, rl, optimizer, batch_inputs, mesh)
  if sample:
    # The KV cache the sampler's prefill leaves: the shard shape of its values (B, kv_heads, S,
    # head_dim); the keys are stored transposed (models/kv_cache.init_cache).
    fill = functools.partial(prefill, model_cfg=cfg, max_new_tokens=6, mesh=mesh)
    _, cache, _ = jax.jit(fill)(state.params, prompts, mask)
    k = cache[0]["v"]  # one cache per layer (the sampler runs the stacked layers unrolled)
    cache_shard = list(k.sharding.shard_shape(k.shape))
    greedy, sampled = (np.asarray(r.completion_tokens) for r in (greedy, sampled))
  params = jax.device_get(state.params)
  return greedy, sampled, params, float(metrics["loss"]), cache_shard


def main():
  devices = jax.devices()
  assert len(devices) == 8, devices
  single = mesh_of((1, 1, 1), devices[:1])
  # One fixed rollout batch for the updates, sampled on one device.
  r = generate(perturbed_params(CFG), PROMPTS, PROMPTS != 0, jax.random.key(3), model_cfg=CFG,
               max_new_tokens=6, temperature=1.0, eos_id=2, pad_id=0)
  rewards = (np.asarray(r.completion_tokens) == 7).sum(1).astype(np.float32)
  inputs = RewardInputs(jnp.asarray(rewards), {}, jnp.int32(0))
  batch_inputs = (jax.device_get(r), jax.device_get(inputs))
  ref = run_on(single, batch_inputs)
  # Each prompt once for its 4 rows (rl.shared_prompt_forward): its minibatches are whole
  # groups, so its reference is its own single-device run.
  ref_shared = run_on(single, batch_inputs, shared=True, sample=False)
  out = {}
  for shape in MESHES:
    mesh = mesh_of(shape, devices)
    got = run_on(mesh, batch_inputs)
    # Micro-batching is mesh-independent arithmetic: checked on the two mixed meshes (CI time).
    accum = (run_on(mesh, batch_inputs, micro=4, sample=False)
             if shape in ((2, 2, 2), (1, 2, 4)) else None)
    # (2, 2, 2): rows over data x fsdp (a minibatch's 2 prompt rows unevenly over 4 devices)
    # and heads over tensor.
    shared = (run_on(mesh, batch_inputs, shared=True, sample=False)
              if shape == (2, 2, 2) else None)
    diff = lambda a, b: max(float(np.max(np.abs(x - y)))  # noqa: E731
                            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    out[str(shape)] = dict(
        greedy_equal=bool(np.array_equal(got[0], ref[0])),
        sampled_equal=bool(np.array_equal(got[1], ref[1])),
        params_max_diff=diff(got[2], ref[2]),
        **({} if accum is None else dict(accum_params_max_diff=diff(accum[2], got[2]))),
        params_moved=diff(got[2], jax.device_get(perturbed_params(CFG))),
        loss=got[3], ref_loss=ref[3], cache_shard=got[4],
        **({} if shared is None else dict(
            shared_params_max_diff=diff(shared[2], ref_shared[2]), shared_loss=shared[3],
            shared_ref_loss=ref_shared[3])))
  print(json.dumps(out))


def refill_main(path: str):
  """tests/test_refill.py's slot engine (4 slots, sampled with top-k/top-p, per-row limits) on
  the (2, 2, 2) mesh, its result written to `path` as JSON."""
  from grpo_jax.rollout.refill import generate_refill  # noqa: PLC0415
  from grpo_jax.rollout.sampler import Sampling  # noqa: PLC0415
  from grpo_jax.rollout.types import row_limits_or_max  # noqa: PLC0415
  from tests import test_refill as t  # noqa: PLC0415
  mesh = mesh_of((2, 2, 2), jax.devices())
  cfg = tiny_model_config()
  params = t._params(cfg)  # off the mesh (run_on says why)
  with jax.set_mesh(mesh):
    params = jax.device_put(params, shardings(params, mesh))
    prompts, mask = shard_batch((t.PROMPTS, t.PROMPT_MASK), mesh, replicate_indivisible=True)
    sampling = Sampling(**t._settings(cfg, temperature=0.8, top_k=6, top_p=0.9, mesh=mesh,
                                      decode_slots=4))
    out, _ = jax.jit(lambda p, tk, m, k: generate_refill(
        p, tk, m, k, row_limits_or_max(t.LIMITS, t.ROWS, t.NEW), sampling=sampling))(
            params, prompts, mask, jax.random.key(7))
  with open(path, "w") as f:
    json.dump(dict(devices=len(jax.devices()),
                   completion_tokens=np.asarray(out.completion_tokens).tolist(),
                   completion_mask=np.asarray(out.completion_mask).tolist(),
                   logprobs=np.asarray(out.logprobs).tolist()), f)


MOE_CFG = tiny_model_config(vocab_size=16, family="qwen3_moe", num_experts=4,
                            experts_per_token=2, moe_intermediate_size=16, norm_topk_prob=True)
MOE_MESHES = [(1, 2, 1, 4), (2, 1, 2, 2)]


def moe_run_on(mesh, batch_inputs):
  """The MoE model's greedy tokens and two updates (routing replayed, the load-balancing loss
  on) under `mesh`: (greedy tokens, params, loss, the expert kernels' shard shape)."""
  cfg = MOE_CFG
  rl = rl_defaults(num_minibatches=2, kl_coef=0.05, routing_replay="rollout",
                   router_aux_coef=0.01)
  optimizer = make_optimizer(OPTIM, 10)
  state = create_train_state(perturbed_params(cfg), optimizer, jax.random.key(1), None,
                             rl.kl_coef)  # off the mesh (run_on says why)
  with jax.set_mesh(mesh):
    state = jax.device_put(state, shardings(state, mesh))
    prompts, mask = shard_batch((PROMPTS, PROMPTS != 0), mesh)
    greedy = generate(state.params, prompts, mask, jax.random.key(0), model_cfg=cfg,
                      max_new_tokens=6, eos_id=2, pad_id=0, mesh=mesh, temperature=0.0)
    state, metrics = two_updates(state, cfg, rl, optimizer, batch_inputs, mesh)
    kernel = state.params["layers"]["mlp"]["experts"]["gate_proj"]["kernel"]
    return (np.asarray(greedy.completion_tokens), jax.device_get(state.params),
            float(metrics["loss"]), list(kernel.sharding.shard_shape(kernel.shape)))


def moe_main(path: str):
  """A mixture of experts sharded over the `expert` axis (and rows over data x fsdp x expert)
  against the single-device run; the result written to `path` as JSON."""
  devices = jax.devices()
  r = Sampling(MOE_CFG, 6, eos_id=2, pad_id=0).grouped(1, record_routes=True)(
      perturbed_params(MOE_CFG), PROMPTS, PROMPTS != 0, jax.random.key(3))
  rewards = (np.asarray(r.completion_tokens) == 7).sum(1).astype(np.float32)
  batch_inputs = (jax.device_get(r), (jax.device_get(RewardInputs(jnp.asarray(rewards), {},
                                                                  jnp.int32(0)))))
  ref = moe_run_on(mesh_of((1, 1, 1, 1), devices[:1]), batch_inputs)
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(ref[1]), jax.tree.leaves(jax.device_get(perturbed_params(MOE_CFG)))))
  out = {"params_moved": moved}
  for shape in MOE_MESHES:
    got = moe_run_on(mesh_of(shape, devices), batch_inputs)
    out[str(shape)] = dict(
        greedy_equal=bool(np.array_equal(got[0], ref[0])),
        params_max_diff=max(float(np.max(np.abs(a - b)))
                            for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(ref[1]))),
        loss=got[2], ref_loss=ref[2], expert_kernel_shard=got[3])
  with open(path, "w") as f:
    json.dump(out, f)


if __name__ == "__main__":
  if sys.argv[1:2] == ["refill"]:
    sys.exit(refill_main(sys.argv[2]))
  if sys.argv[1:2] == ["moe"]:
    sys.exit(moe_main(sys.argv[2]))
  sys.exit(main())
