"""Scanned layers (model.scan_layers): params stacked on a leading layer axis and one nn.scan,
equal to the unscanned decoder; HF export unstacks; the mesh rules keep the layer axis whole."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.defaults import rl_defaults

from grpo_jax.models.decoder import Decoder, positions_from_mask, stack_layers, unstack_layers
from grpo_jax.models.hf import load_hf_checkpoint
from grpo_jax.models.hf_export import export_hf_checkpoint
from grpo_jax.models.scoring import completion_scores
from grpo_jax.parallel.mesh import param_logical_axes
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.experience import RewardInputs
from grpo_jax.train.loop import train
from grpo_jax.train.state import create_train_state
from grpo_jax.train.step import StepSpec, make_rl_step
from tests.fixtures import perturbed_params, small_tiny_config, tiny_model_config
from tests.test_memory import _seqs

CFG = tiny_model_config(vocab_size=37, num_layers=3)
SCANNED = dataclasses.replace(CFG, scan_layers=True)


def _close(a, b, tol=1e-6):
  """Equal within tol relative to the larger magnitude of the two arrays (fp32 rounding)."""
  a, b = np.asarray(a), np.asarray(b)
  scale = max(float(np.max(np.abs(b))), 1.0)
  assert float(np.max(np.abs(a - b))) <= tol * scale, float(np.max(np.abs(a - b)))


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_decoder_equals_unscanned(remat):
  params = perturbed_params(CFG)
  stacked = stack_layers(params, CFG.num_layers)
  seqs = _seqs(new=5)
  tokens = jnp.concatenate([seqs.prompt_tokens, seqs.completion_tokens], 1)
  mask = jnp.concatenate([seqs.prompt_mask, seqs.completion_mask], 1)
  want = Decoder(CFG).apply({"params": params}, tokens, positions_from_mask(mask), mask)[0]
  got = Decoder(dataclasses.replace(SCANNED, remat=remat)).apply(
      {"params": stacked}, tokens, positions_from_mask(mask), mask)[0]
  _close(got, want)

  def grads(cfg, p):
    return jax.grad(lambda q: jnp.sum(completion_scores(q, cfg, seqs)[0]))(p)
  # Gradients sum many float32 terms in another order (measured: the tied embedding's, 3.4e-5
  # on entries of magnitude 21, i.e. 1.6e-6 of the scale); a wrong layer would be off by O(1).
  for g, w in zip(jax.tree.leaves(unstack_layers(grads(dataclasses.replace(
      SCANNED, remat=remat), stacked), CFG.num_layers)), jax.tree.leaves(grads(CFG, params))):
    _close(g, w, tol=1e-5)
  # The sampler (a stacked KV cache) draws the same tokens.
  kw = dict(max_new_tokens=6, eos_id=2, pad_id=0, temperature=1.0)
  a = generate(params, seqs.prompt_tokens, seqs.prompt_mask, jax.random.key(3), model_cfg=CFG,
               **kw)
  b = generate(stacked, seqs.prompt_tokens, seqs.prompt_mask, jax.random.key(3),
               model_cfg=SCANNED, **kw)
  np.testing.assert_array_equal(a.completion_tokens, b.completion_tokens)
  _close(b.logprobs, a.logprobs)


def test_export_of_scanned_params_loads_as_the_unscanned_model(tmp_path):
  params = perturbed_params(CFG)
  export_hf_checkpoint(stack_layers(params, CFG.num_layers), SCANNED, tmp_path / "hf",
                       model_type="llama")
  model_cfg, loaded = load_hf_checkpoint(tmp_path / "hf")
  assert not model_cfg.scan_layers
  for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_mesh_rules_give_stacked_layers_an_unsharded_layer_axis():
  assert param_logical_axes("layers/self_attn/q_proj/kernel", 4) == (
      None, "embed", "heads", "head_dim")
  assert param_logical_axes("layers/mlp/down_proj/kernel", 3) == (None, "mlp", "embed")
  assert param_logical_axes("layers/input_layernorm/weight", 2) == (None, "norm")
  assert param_logical_axes("layers_0/self_attn/q_proj/kernel", 3) == (
      "embed", "heads", "head_dim")
  assert param_logical_axes("layers_0/self_attn/k_proj/bias", 2) == ("kv_heads", "head_dim")
  assert param_logical_axes("layers_0/self_attn/o_proj/kernel", 3) == (
      "heads", "head_dim", "embed")
  assert param_logical_axes("embed_tokens/embedding", 2) == ("vocab", "embed")


def test_one_rl_step_with_scanned_layers_equals_the_unscanned_step():
  """The run's RL step (prepare + update + end of step) from the same state. Plain SGD: Adam
  turns float32 rounding in a near-zero gradient entry into a step of the learning rate (see
  tests/test_update.py), which would hide the comparison."""
  rl = rl_defaults(num_minibatches=2, kl_coef=0.05, entropy_coef=0.01)
  params = perturbed_params(CFG)
  rollout = generate(params, _seqs().prompt_tokens, _seqs().prompt_mask, jax.random.key(2),
                     model_cfg=CFG, max_new_tokens=5, eos_id=2, pad_id=0)
  inputs = RewardInputs(jnp.asarray([1.0, 0.0, 0.5, 0.0]), {}, jnp.int32(1))
  results = []
  for cfg, p in ((CFG, params), (SCANNED, stack_layers(params, CFG.num_layers))):
    state = create_train_state(p, optax.sgd(0.05), jax.random.key(1), None, rl.kl_coef)
    step = jax.jit(make_rl_step(StepSpec(cfg, rl, optax.sgd(0.05), 2, 1.0, 5)))
    new_state, metrics = step(state, rollout, inputs)
    results.append((new_state.params, metrics))
  (want, want_m), (got, got_m) = results
  moved = 0.0
  for g, w, before in zip(jax.tree.leaves(unstack_layers(got, CFG.num_layers)),
                          jax.tree.leaves(want), jax.tree.leaves(params)):
    _close(g, w, tol=1e-6)
    moved = max(moved, float(jnp.max(jnp.abs(w - before))))
  assert moved > 1e-3
  # abs 1e-6: the loss (~0.017) is a sum of terms of order 1 that largely cancel, so its
  # rounding is absolute, not relative to its small value.
  for key in ("loss", "kl", "entropy", "rollout_kl"):
    assert float(got_m[key]) == pytest.approx(float(want_m[key]), rel=1e-5, abs=1e-6), key


def test_a_run_with_scanned_layers_goes_through_the_loop(tmp_path):
  config = small_tiny_config(steps=2)
  config.model.update(scan_layers=True, remat="full", logits_chunk=2)
  state = train(config, str(tmp_path), log=lambda *_: None)
  assert "layers" in state.params and "layers_0" not in state.params
  with open(tmp_path / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [0, 1, 2]


def test_no_head_is_split_on_a_1_1_4_mesh_with_2_kv_heads():
  """Tensor = 4 would divide k_proj's 2 x 8 = 16 flattened columns but not its 2 heads: the
  kernels carry heads as a dimension (embed, kv_heads, head_dim), so the rules replicate k/v
  instead of putting half a head on each device; q/o (4 heads) are split whole. Checked on the
  params placed on a real (1, 1, 4) mesh of 4 CPU devices (a subprocess)."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  import types  # noqa: PLC0415

  from grpo_jax.parallel.mesh import split_heads_note  # noqa: PLC0415
  code = """
import json, jax, ml_collections
from grpo_jax.models.decoder import init_params
from grpo_jax.parallel.mesh import make_mesh, place_tree
from tests.fixtures import tiny_model_config
cfg = tiny_model_config(num_heads=4, num_kv_heads=2, head_dim=8)
mesh = make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=4)))
att = place_tree(init_params(cfg, jax.random.key(0)), mesh)["layers_0"]["self_attn"]
print(json.dumps({n: [list(att[n][leaf].shape), list(att[n][leaf].addressable_shards[0].data.shape)]
                  for n in ("q_proj", "k_proj", "v_proj", "o_proj") for leaf in ["kernel"]}))
"""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=root,
                                XLA_FLAGS="--xla_force_host_platform_device_count=4"))
  assert out.returncode == 0, out.stderr[-2000:]
  shapes = json.loads(out.stdout.strip().splitlines()[-1])
  hidden = tiny_model_config().hidden_size
  assert shapes == {  # [global shape, one device's shard]
      "q_proj": [[hidden, 4, 8], [hidden, 1, 8]],  # one whole head per device
      "k_proj": [[hidden, 2, 8], [hidden, 2, 8]],  # 2 heads over 4 devices: replicated
      "v_proj": [[hidden, 2, 8], [hidden, 2, 8]],
      "o_proj": [[4, 8, hidden], [1, 8, hidden]]}
  cfg = tiny_model_config(num_heads=4, num_kv_heads=2, head_dim=8)
  mesh = types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 4})
  assert split_heads_note(cfg, mesh) == (
      "warning: mesh tensor=4 does not divide the model's head counts (num_heads=4, "
      "num_kv_heads=2); the projections of [2] heads are replicated over tensor instead of "
      "splitting a head.")


def test_scanned_hf_checkpoint_matches_transformers(tmp_path):
  """HF parity with scanned layers: a transformers Qwen2 checkpoint, loaded and stacked, gives
  transformers' logits (the same bar as tests/test_hf.py)."""
  from tests.test_hf import (assert_logits_close, our_logits, save,  # noqa: PLC0415
                             tiny_hf_model, torch_logits)
  model = tiny_hf_model("qwen2")
  model_cfg, params = load_hf_checkpoint(save(model, tmp_path))
  scanned = dataclasses.replace(model_cfg, scan_layers=True)
  assert_logits_close(our_logits(scanned, stack_layers(params, model_cfg.num_layers)),
                      torch_logits(model))


def test_resume_with_scanned_layers_reproduces_the_run(tmp_path):
  """A scanned, rematerialised run resumed from its step-1 checkpoint ends in the same state
  and records (wall-clock fields aside) as the uninterrupted run, bit for bit."""
  import shutil  # noqa: PLC0415

  from tests.tiny_runs import strip  # noqa: PLC0415
  config = small_tiny_config(steps=3, eval_every=10)
  config.model.update(scan_layers=True, remat="full", logits_chunk=2)
  config.train.checkpoint_every = 1
  records = lambda d: [json.loads(x) for x in open(d / "metrics.jsonl")]  # noqa: E731
  whole = train(config, str(tmp_path / "whole"), log=lambda *_: None)
  resumed_dir = tmp_path / "resumed"
  train(config, str(resumed_dir), log=lambda *_: None)
  for step in (2, 3):
    shutil.rmtree(resumed_dir / "checkpoints" / str(step))
  lines = []
  resumed = train(config, str(resumed_dir), log=lines.append)
  assert any("resumed from checkpoint" in str(x) and x.endswith("/1 (no warm-up)")
             for x in lines), lines
  assert strip(records(resumed_dir)) == strip(records(tmp_path / "whole"))
  for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
