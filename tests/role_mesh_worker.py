"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8
(tests/test_role_meshes.py): the learner on devices 0-3 (fsdp 2 x tensor 2), the sampler on
devices 4-7 (data 4); then the meshes mesh.rollout_devices=4 carves (role_meshes) and the timed
sync between them; prints one JSON line."""

import json

import jax
import numpy as np

from grpo_jax.models.partitioning import place
from grpo_jax.parallel.mesh import make_mesh, mesh_config, role_meshes, shard_batch
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.sources.experience_source import Run
from tests.fixtures import perturbed_params, tiny_model_config

CFG = tiny_model_config(vocab_size=16)
PROMPTS = np.repeat(np.array([[1, 5, 6], [1, 9, 4], [0, 1, 3], [1, 12, 11]], np.int32), 4, 0)


def _run(mesh, rollout_mesh):
  return Run(settings=None, axis=None, task=None, spec=None, base_keys=(), workdirs=(),
             mesh=mesh, log=print, rollout_mesh=rollout_mesh)


def main():
  devices = jax.devices()
  learner = make_mesh(mesh_config(1, 2, 2), devices[:4])
  sampler = make_mesh(mesh_config(4, 1, 1), devices[4:])
  host = perturbed_params(CFG)
  params = place(host, learner)
  synced = _run(learner, sampler).sync_weights(params)
  leaves, synced_leaves = jax.tree.leaves(params), jax.tree.leaves(synced)
  out = dict(
      learner_devices=sorted({d.id for x in leaves for d in x.sharding.device_set}),
      sampler_devices=sorted({d.id for x in synced_leaves for d in x.sharding.device_set}),
      equal=all(np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(leaves, synced_leaves)),
      same_mesh_is_identity=_run(learner, None).sync_weights(params) is params)
  settings = dict(model_cfg=CFG, max_new_tokens=6, temperature=1.0, eos_id=2, pad_id=0)
  key = jax.random.key(3)
  want = generate(host, PROMPTS, PROMPTS != 0, key, **settings)
  with jax.set_mesh(sampler):
    tokens, mask = shard_batch((PROMPTS, PROMPTS != 0), sampler)
    got = jax.jit(lambda p, t, m, k: generate(p, t, m, k, **settings))(synced, tokens, mask, key)
  out["tokens_equal"] = bool(np.array_equal(np.asarray(got.completion_tokens),
                                            np.asarray(want.completion_tokens)))
  out["rollout_devices"] = sorted({d.id for d in got.completion_tokens.sharding.device_set})
  out.update(_carved(host))
  print(json.dumps(out))


def _carved(host) -> dict:
  """role_meshes(mesh.data=-1, rollout_devices=4): its meshes' devices and shapes, and what
  sync_weights_timed reports between them (and on one shared mesh)."""
  learner, sampler = role_meshes(mesh_config(-1), 4)
  params = place(host, learner)
  synced, timing = _run(learner, sampler).sync_weights_timed(params)
  _, shared = _run(learner, None).sync_weights_timed(params)
  ids = lambda tree: sorted({d.id for x in jax.tree.leaves(tree)  # noqa: E731
                             for d in x.sharding.device_set})
  return dict(carved_learner=ids(params), carved_sampler=ids(synced),
              carved_shapes=[list(learner.shape.values()), list(sampler.shape.values())],
              shared_alone=role_meshes(mesh_config(-1), 0)[1] is None,
              sync_bytes=timing["weight_sync_bytes"], sync_s=timing["weight_sync_s"],
              params_bytes=int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(host))),
              shared_timing=shared)


if __name__ == "__main__":
  main()
