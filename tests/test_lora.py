"""LoRA (grpo_jax/models/lora.py): step 0 is the base model exactly; the adapters' gradient is
the full weight gradient projected; PEFT's own loader and a merged checkpoint give our logits;
the RL step trains the adapters only, against the base as reference; configs are checked."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers

from configs import grpo_tiny_lora
from grpo_jax.config import ConfigError, validate
from grpo_jax.defaults import rl_defaults
from grpo_jax.models import hf, hf_export, lora
from grpo_jax.models.decoder import decoder_apply, init_params, positions_from_mask
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.learner.state import (create_train_state, make_optimizer, policy_params,
                                  reference_params)
from grpo_jax.train.learner.step import StepSpec, make_rl_step
from tests.fixtures import tiny_model_config
from tests.fixtures import transformers_logits, xla_env
from tests.test_hf import MASK, TOKENS, assert_logits_close, save, tiny_hf_model


def logits_of(model_cfg, params):
  mask = jnp.asarray(MASK)
  fn = jax.jit(lambda p: decoder_apply(model_cfg, p, jnp.asarray(TOKENS, jnp.int32),
                                       positions_from_mask(mask), mask)[0])
  return np.asarray(fn(params))


def random_adapters(base, rank, seed, targets=lora.TARGETS):
  """Adapters with B != 0 too (a trained state), so that every projection's delta shows."""
  ad = lora.init_adapters(base, targets, rank, jax.random.key(seed))
  leaves, treedef = jax.tree.flatten(ad)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape)
                                      for x, k in zip(leaves, keys)])


def test_step_zero_equals_the_base_model_exactly():
  cfg = dataclasses.replace(tiny_model_config(vocab_size=97), qkv_bias=True, lora_scale=2.0)
  base = init_params(cfg, jax.random.key(0))
  adapters = lora.init_adapters(base, lora.TARGETS, 8, jax.random.key(1))
  assert all(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(adapters)[0::2])  # A != 0
  with_adapters = lora.LoraParams(base, adapters)
  np.testing.assert_array_equal(logits_of(cfg, with_adapters), logits_of(cfg, base))
  # The sampler too (prefill + cached decode): the same tokens and log-probs, bit for bit.
  prompts = jnp.asarray(TOKENS[:, :5], jnp.int32)
  sample = jax.jit(lambda p: generate(p, prompts, prompts != 0, jax.random.key(3), model_cfg=cfg,
                                      max_new_tokens=6, temperature=1.0, eos_id=2, pad_id=0))
  a, b = sample(with_adapters), sample(base)
  np.testing.assert_array_equal(np.asarray(a.completion_tokens), np.asarray(b.completion_tokens))
  np.testing.assert_array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))


def test_adapter_gradients_are_the_weight_gradient_projected():
  """L(W + s A B): dL/dA = s G B^T and dL/dB = s A^T G with G = dL/dW at the merged weights, an
  independent route (the gradient of merged params) for every adapted kernel."""
  cfg = dataclasses.replace(tiny_model_config(vocab_size=97), lora_scale=0.5)
  base = init_params(cfg, jax.random.key(0))
  adapters = random_adapters(base, 4, 2)
  mask = jnp.asarray(MASK)
  tokens = jnp.asarray(TOKENS, jnp.int32)

  def loss(params):
    logits = decoder_apply(cfg, params, tokens, positions_from_mask(mask), mask)[0]
    return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits) ** 2, 0.0)) * 1e-3

  grads = jax.grad(lambda ad: loss(lora.LoraParams(base, ad)))(adapters)
  merged_grads = jax.grad(loss)(lora.merge(base, adapters, cfg.lora_scale))
  for layer in range(cfg.num_layers):
    for parent, projections in adapters["layers"].items():
      for name, ad in projections.items():
        k = lora.input_dims(name)
        g = merged_grads["layers"][parent][name]["kernel"][layer]
        g2 = g.reshape(int(np.prod(g.shape[:k])), -1)
        a2 = ad["lora_a"][layer].reshape(g2.shape[0], -1)
        b2 = ad["lora_b"][layer].reshape(a2.shape[1], -1)
        got = grads["layers"][parent][name]
        np.testing.assert_allclose(got["lora_a"][layer].reshape(a2.shape), 0.5 * g2 @ b2.T,
                                   rtol=2e-4, atol=1e-7)
        np.testing.assert_allclose(got["lora_b"][layer].reshape(b2.shape), 0.5 * a2.T @ g2,
                                   rtol=2e-4, atol=1e-7)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_peft_loads_our_adapter_and_the_merged_export_matches(kind, tmp_path):
  model = tiny_hf_model(kind)
  source = save(model, tmp_path / "base")
  model_cfg, base = hf.load_hf_checkpoint(source)
  rank, alpha = 8, 16.0
  model_cfg = dataclasses.replace(model_cfg, lora_scale=lora.lora_scale(rank, alpha))
  targets = lora.TARGETS if kind == "qwen2" else ("q_proj", "v_proj", "o_proj", "down_proj")
  adapters = random_adapters(base, rank, 5, targets)
  ours = logits_of(model_cfg, lora.LoraParams(base, adapters))
  assert np.abs(ours - logits_of(model_cfg, base))[MASK].max() > 1e-2  # the adapters matter

  import peft
  folder = hf_export.export_peft_adapter(adapters, model_cfg, tmp_path / "adapter", rank=rank,
                                         alpha=alpha, base_model=str(source))
  config = json.loads((folder / "adapter_config.json").read_text())
  assert (config["r"], config["lora_alpha"], config["peft_type"]) == (rank, alpha, "LORA")
  assert sorted(config["target_modules"]) == sorted(targets)
  fresh = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
  with_adapter = peft.PeftModel.from_pretrained(fresh, folder).eval()
  assert_logits_close(ours, transformers_logits(with_adapter, TOKENS, MASK))

  merged = hf_export.export_hf_checkpoint(lora.merge(base, adapters, model_cfg.lora_scale),
                                          model_cfg, tmp_path / "merged", source_dir=source)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
  assert_logits_close(ours, transformers_logits(reloaded, TOKENS, MASK))
  merged_peft = transformers_logits(with_adapter.merge_and_unload(), TOKENS, MASK)
  assert_logits_close(transformers_logits(reloaded, TOKENS, MASK), merged_peft)


def test_the_rl_step_trains_only_the_adapters_against_the_base():
  cfg = dataclasses.replace(tiny_model_config(vocab_size=16), lora_scale=2.0)
  base = init_params(cfg, jax.random.key(0))
  adapters = lora.init_adapters(base, lora.TARGETS, 4, jax.random.key(1))
  rl = rl_defaults(kl_coef=0.05, num_iterations=2, num_minibatches=2)
  optim = dict(learning_rate=1e-2, warmup_steps=1, weight_decay=0.0, b1=0.9, b2=0.99,
               max_grad_norm=1.0)
  optimizer = make_optimizer(ml_collections.ConfigDict(optim), 10)
  state = create_train_state(adapters, optimizer, jax.random.key(2), kl_coef=rl.kl_coef,
                             base_params=base)
  assert state.ref_params is None and reference_params(state) is base
  # The optimizer holds moments of the adapters only (2 x the adapter count, plus the step
  # counts of Adam and of the schedule).
  moments = sum(x.size for x in jax.tree.leaves(state.opt_state))
  assert moments == 2 * lora.count(adapters) + 2
  base_copy = jax.tree.map(np.asarray, base)
  prompts = np.repeat(np.array([[1, 5, 6], [1, 9, 4]], np.int32), 4, 0)
  rollout = generate(policy_params(state), prompts, prompts != 0, jax.random.key(3),
                     model_cfg=cfg, max_new_tokens=4, temperature=1.0, eos_id=2, pad_id=0)
  rewards = np.asarray((rollout.completion_tokens[:, 0] % 2) == 0, np.float32)
  step = jax.jit(make_rl_step(StepSpec(cfg, rl, optimizer, 4, 1.0, 4)), donate_argnums=0)
  state, metrics = step(state, rollout, RewardInputs(rewards, {}, np.int32(2)))
  # Policy == reference before the update: the KL of the rollout is exactly 0.
  assert float(metrics["rollout_kl"]) == 0.0
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.base_params),
               base_copy)
  b_norm = sum(float(jnp.abs(x["lora_b"]).sum()) for m in state.params.values()
               for p in m.values() for x in p.values())
  assert b_norm > 0 and int(state.step) == 1 and int(state.skipped_updates) == 0


LORA_CASES = [
    (dict(rank=-1), "lora.rank=-1"),
    (dict(alpha=0.0), "lora.alpha=0.0"),
    (dict(dropout=0.1), "lora.dropout=0.1"),
    (dict(targets="qkv"), "unknown module qkv"),
    (dict(targets=""), "no module named"),
]


@pytest.mark.parametrize("fields,needle", LORA_CASES, ids=[c[1] for c in LORA_CASES])
def test_bad_lora_fields_are_one_sentence(fields, needle):
  config = grpo_tiny_lora.get_config()
  config.lora.update(fields)
  with pytest.raises(ConfigError, match=needle):
    validate(config)


def test_a_refreshed_reference_is_refused_under_lora():
  config = grpo_tiny_lora.get_config()
  config.rl.ref_update_every = 2
  with pytest.raises(ConfigError, match="rl.ref_update_every=2 with lora.rank=8"):
    validate(config)
  validate(grpo_tiny_lora.get_config())
  assert torch.__version__  # torch is what PEFT runs on


LORA_RUN = ["--config.lora.rank=4", "--config.lora.alpha=8.0", "--config.rl.ref_update_every=0",
            "--config.optim.learning_rate=2e-3"]


@pytest.mark.slow
def test_sigkill_then_resume_with_lora_reproduces_the_uninterrupted_run(tmp_path, env):
  """tests/test_checkpoint.py's kill/resume test with LoRA on: the checkpoints hold the adapters
  (not the base), the resumed run rebuilds the base (seed + warm-up) and ends bit-identical."""
  import random
  import signal

  from tests.tiny_runs import N, raw_state, records, run, start_and_signal, strip
  reference = tmp_path / "reference"
  run(reference, env, *LORA_RUN)
  rng = random.Random()
  at_step, delay = rng.choice(range(N + 1, 2 * N)), rng.uniform(0.0, 0.05)
  workdir = tmp_path / "run"
  code, stderr, _ = start_and_signal(workdir, env, signal.SIGKILL, at_step, delay, *LORA_RUN)
  where = f"killed after the progress line of step {at_step} + {delay:.3f}s"
  assert code == -signal.SIGKILL, (where, stderr[-2000:])
  stdout = run(workdir, env, *LORA_RUN)
  assert (f"resumed from checkpoint {workdir}/checkpoints/{N} (LoRA adapters; the frozen base "
          f"rebuilt from the seed and the warm-up)") in stdout, where
  assert strip(records(workdir)) == strip(records(reference)), where
  final, ref_final = raw_state(workdir, 2 * N), raw_state(reference, 2 * N)
  assert jax.tree.structure(final) == jax.tree.structure(ref_final)
  for x, y in zip(jax.tree.leaves(final), jax.tree.leaves(ref_final)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # The checkpoint holds adapters and no base or reference weights.
  assert set(final["params"]["layers"]["self_attn"]["q_proj"]) == {"lora_a", "lora_b"}
  assert final.get("base_params") is None and final.get("ref_params") is None
  assert records(workdir)[-1]["eval_accuracy"] >= 0.0


@pytest.mark.slow
def test_lora_run_on_a_mesh_equals_the_single_device_run(tmp_path):
  """The tiny LoRA recipe on (data, fsdp, tensor) = (1, 2, 2) over 4 CPU devices: the base and
  the adapters are placed by the mesh rules, and the records equal the one-device run's."""
  import os
  import subprocess
  import sys

  from tests.tiny_runs import ROOT, records
  small = ["--config.warmup.steps=10", "--config.train.steps=3", "--config.train.eval_every=3",
           "--config.train.eval_size=20", "--config.train.eval_batch_size=20",
           "--config.rollout.num_prompts=4", "--config.rollout.group_size=4",
           "--config.train.checkpoint_every=0"]

  def run(workdir, devices, *extra):
    env = xla_env(devices)
    out = subprocess.run([sys.executable, "-m", "grpo_jax.main",
                          "--config=configs/grpo_tiny_lora.py", f"--workdir={workdir}", *small,
                          *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout

  run(tmp_path / "one", 1)
  stdout = run(tmp_path / "mesh", 4, "--config.mesh.data=1", "--config.mesh.fsdp=2",
               "--config.mesh.tensor=2")
  assert "mesh (data, fsdp, tensor, expert, context) = (1, 2, 2, 1, 1)" in stdout
  assert "frozen base" in stdout
  one, mesh = records(tmp_path / "one"), records(tmp_path / "mesh")
  assert [r["step"] for r in mesh] == [0, 1, 2, 3]
  for a, b in zip(one, mesh):
    for key in ("eval_accuracy", "reward_mean", "response_len"):
      assert a.get(key) == b.get(key), (a["step"], key)
    for key in ("loss", "kl", "grad_norm"):
      if key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["step"], key)


def test_adapter_initialisation_does_not_depend_on_the_other_targets():
  cfg = tiny_model_config(vocab_size=16)
  base = init_params(cfg, jax.random.key(0))
  every = lora.init_adapters(base, lora.TARGETS, 4, jax.random.key(1))
  assert every["layers"]["self_attn"]["q_proj"]["lora_a"].shape[0] == cfg.num_layers
  only_v = lora.init_adapters(base, ("v_proj",), 4, jax.random.key(1))
  np.testing.assert_array_equal(only_v["layers"]["self_attn"]["v_proj"]["lora_a"],
                                every["layers"]["self_attn"]["v_proj"]["lora_a"])
  # layer l's A is drawn from fold_in(fold_in(key, l), index of the projection)
  q = every["layers"]["self_attn"]["q_proj"]["lora_a"]
  assert float(jnp.abs(q[0] - q[1]).max()) > 0
  a = every["layers"]["mlp"]["down_proj"]["lora_a"][0]  # fan_in = intermediate_size
  assert float(jnp.abs(a).max()) <= 1 / np.sqrt(cfg.intermediate_size)
  assert float(jnp.abs(a).max()) > 0.9 / np.sqrt(cfg.intermediate_size)
