"""One param layout: the layers' params stacked on a leading layer axis and run by one nn.scan
(rematerialised by model.remat), unrolled by the sampler's cached forwards; Hugging Face's
per-layer names only at the checkpoint edge; logical axes declared where each param is defined;
checkpoints of the older per-layer layout restored by stacking them."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.decoder import Decoder, param_axes, positions_from_mask
from grpo_jax.models.layout import unstack_layers
from grpo_jax.models.hf import load_hf_checkpoint, param_layout
from grpo_jax.models.hf_export import export_hf_checkpoint
from grpo_jax.models.partitioning import axes_of, declared_axes
from grpo_jax.models.scoring import completion_scores
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.run.checkpoint import Checkpoints, to_saveable
from grpo_jax.train.stages.rl import train
from tests import numpy_reference
from tests.fixtures import perturbed_params, small_tiny_config, tiny_model_config, xla_env
from tests.test_memory import _seqs
from tests.tiny_runs import strip

CFG = tiny_model_config(vocab_size=37, num_layers=3)


def _close(a, b, tol=1e-6):
  """Equal within tol relative to the larger magnitude of the two arrays (fp32 rounding)."""
  a, b = np.asarray(a), np.asarray(b)
  scale = max(float(np.max(np.abs(b))), 1.0)
  assert float(np.max(np.abs(a - b))) <= tol * scale, float(np.max(np.abs(a - b)))


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_layers_equal_a_per_layer_numpy_loop(remat):
  """The scan over stacked params (with and without remat) gives the logits of an independent
  NumPy decoder that loops over the layers one by one (tests/numpy_reference.py)."""
  import dataclasses  # noqa: PLC0415
  params = perturbed_params(CFG)
  seqs = _seqs(new=5)
  tokens = jnp.concatenate([seqs.prompt_tokens, seqs.completion_tokens], 1)
  mask = jnp.concatenate([seqs.prompt_mask, seqs.completion_mask], 1)
  got = Decoder(dataclasses.replace(CFG, remat=remat)).apply(
      {"params": params}, tokens, positions_from_mask(mask), mask)[0]
  for row in range(tokens.shape[0]):
    want = numpy_reference.forward(params, CFG, np.asarray(tokens[row]),
                                   np.asarray(mask[row]).astype(bool))
    m = np.asarray(mask[row]).astype(bool)
    _close(np.asarray(got[row])[m], want[m], tol=1e-5)


def test_remat_changes_memory_not_gradients_and_the_sampler_unrolls_the_same_layers():
  import dataclasses  # noqa: PLC0415
  params = perturbed_params(CFG)
  seqs = _seqs(new=5)

  def grads(cfg):
    return jax.grad(lambda q: jnp.sum(completion_scores(q, cfg, seqs)[0]))(params)
  for g, w in zip(jax.tree.leaves(grads(dataclasses.replace(CFG, remat="full"))),
                  jax.tree.leaves(grads(CFG))):
    _close(g, w, tol=1e-5)
  # The sampler's cached forwards run the same stacked params unrolled: its log-probs are the
  # scan's teacher-forced ones.
  out = generate(params, seqs.prompt_tokens, seqs.prompt_mask, jax.random.key(3), model_cfg=CFG,
                 max_new_tokens=6, eos_id=2, pad_id=0, temperature=1.0)
  scored = completion_scores(params, CFG, out)[0]
  m = np.asarray(out.completion_mask).astype(bool)
  _close(np.asarray(scored)[m], np.asarray(out.logprobs)[m], tol=1e-5)


def test_export_writes_one_hf_tensor_per_layer_and_loads_back_stacked(tmp_path):
  params = perturbed_params(CFG)
  export_hf_checkpoint(params, CFG, tmp_path / "hf", model_type="llama")
  from safetensors.numpy import load_file  # noqa: PLC0415
  names = set(load_file(str(tmp_path / "hf" / "model.safetensors")))
  assert {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(3)} <= names
  assert not any(".layers." in n and n.split(".layers.")[1].split(".")[0] == "3" for n in names)
  assert len(param_layout(CFG)[0]) == len(names)
  _, loaded = load_hf_checkpoint(tmp_path / "hf")
  assert loaded["layers"]["self_attn"]["q_proj"]["kernel"].shape[0] == CFG.num_layers
  for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_logical_axes_are_declared_where_params_are_defined():
  axes = param_axes(CFG)
  assert axes["layers"]["self_attn"]["q_proj"]["kernel"] == ("layers", "embed", "heads",
                                                              "head_dim")
  assert axes["layers"]["mlp"]["down_proj"]["kernel"] == ("layers", "mlp", "embed")
  assert axes["layers"]["input_layernorm"]["weight"] == ("layers", "norm")
  assert axes["embed_tokens"]["embedding"] == ("vocab", "embed")
  table = declared_axes()  # every param the models define, adapters and heads included
  assert table[("layers", "self_attn", "o_proj", "lora_a")] == ("layers", "heads", "head_dim",
                                                                "lora")
  assert table[("layers", "self_attn", "k_proj", "bias")] == ("layers", "kv_heads", "head_dim")
  # An optimizer moment ends with its param's path; a rank that differs (seeds stacked on a
  # leading axis) is replicated; an undeclared name too.
  assert axes_of(("opt_state", "0", "mu", "layers", "mlp", "up_proj", "kernel"), 3) == (
      "layers", "embed", "mlp")
  assert axes_of(("layers", "mlp", "up_proj", "kernel"), 4) == (None,) * 4
  assert axes_of(("step",), 0) == ()
  assert axes_of(("lm_head", "kernel"), 2) == ("embed", "vocab")
  assert axes_of(("value_params", "head", "kernel"), 2) == ("embed", "value")


def test_a_run_goes_through_the_loop_with_stacked_params(tmp_path):
  config = small_tiny_config(steps=2)
  config.model.update(remat="full", logits_chunk=2)
  state = train(config, str(tmp_path), log=lambda *_: None)
  assert "layers" in state.train.params and "layers_0" not in state.train.params
  with open(tmp_path / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [0, 1, 2]


def test_model_scan_layers_is_refused_in_one_sentence(tmp_path):
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  config = small_tiny_config(steps=2)
  with config.unlocked():
    config.model.scan_layers = True
  with pytest.raises(ConfigError, match="model.scan_layers=True: the layers are always stacked"):
    train(config, str(tmp_path), log=lambda *_: None)


def test_no_head_is_split_on_a_1_1_4_mesh_with_2_kv_heads():
  """Tensor = 4 would divide k_proj's 2 x 8 = 16 flattened columns but not its 2 heads: the
  kernels carry heads as a dimension (layers, embed, kv_heads, head_dim), so the rules
  replicate k/v instead of putting half a head on each device; q/o (4 heads) are split whole.
  Checked on the params placed on a real (1, 1, 4) mesh of 4 CPU devices (a subprocess)."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  import types  # noqa: PLC0415

  from grpo_jax.parallel.mesh import split_heads_note  # noqa: PLC0415
  code = """
import json, jax, ml_collections
from grpo_jax.models.decoder import init_params
from grpo_jax.models.partitioning import place
from grpo_jax.parallel.mesh import make_mesh, mesh_config
from tests.fixtures import tiny_model_config
cfg = tiny_model_config(num_heads=4, num_kv_heads=2, head_dim=8)
mesh = make_mesh(mesh_config(1, 1, 4))
att = place(init_params(cfg, jax.random.key(0)), mesh)["layers"]["self_attn"]
print(json.dumps({n: [list(att[n][leaf].shape), list(att[n][leaf].addressable_shards[0].data.shape)]
                  for n in ("q_proj", "k_proj", "v_proj", "o_proj") for leaf in ["kernel"]}))
"""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env=xla_env(4, PYTHONPATH=root))
  assert out.returncode == 0, out.stderr[-2000:]
  shapes = json.loads(out.stdout.strip().splitlines()[-1])
  hidden, layers = tiny_model_config().hidden_size, tiny_model_config().num_layers
  assert shapes == {  # [global shape, one device's shard]
      "q_proj": [[layers, hidden, 4, 8], [layers, hidden, 1, 8]],  # one whole head per device
      "k_proj": [[layers, hidden, 2, 8], [layers, hidden, 2, 8]],  # 2 heads over 4: replicated
      "v_proj": [[layers, hidden, 2, 8], [layers, hidden, 2, 8]],
      "o_proj": [[layers, 4, 8, hidden], [layers, 1, 8, hidden]]}
  cfg = tiny_model_config(num_heads=4, num_kv_heads=2, head_dim=8)
  mesh = types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 4})
  assert split_heads_note(cfg, mesh) == (
      "warning: mesh tensor=4 does not divide the model's head counts (num_heads=4, "
      "num_kv_heads=2); the projections of [2] heads are replicated over tensor instead of "
      "splitting a head.")


def _records(d):
  return [json.loads(x) for x in open(d / "metrics.jsonl")]


def test_resume_with_remat_reproduces_the_run(tmp_path):
  """A rematerialised run resumed from its step-1 checkpoint ends in the same state and
  records (wall-clock fields aside) as the uninterrupted run, bit for bit."""
  config = small_tiny_config(steps=3, eval_every=10)
  config.model.update(remat="full", logits_chunk=2)
  config.train.checkpoint_every = 1
  whole = train(config, str(tmp_path / "whole"), log=lambda *_: None)
  resumed_dir = tmp_path / "resumed"
  train(config, str(resumed_dir), log=lambda *_: None)
  for step in (2, 3):
    shutil.rmtree(resumed_dir / "checkpoints" / str(step))
  lines = []
  resumed = train(config, str(resumed_dir), log=lines.append)
  assert any("resumed from checkpoint" in str(x) and x.endswith("/1 (no warm-up)")
             for x in lines), lines
  assert strip(_records(resumed_dir)) == strip(_records(tmp_path / "whole"))
  for a, b in zip(jax.tree.leaves(resumed.train.params), jax.tree.leaves(whole.train.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _per_layer(tree, num_layers):
  """Every dict holding stacked "layers" in the older per-layer layout (layers_0, ...)."""
  held = lambda x: isinstance(x, dict) and isinstance(x.get("layers"), dict)  # noqa: E731
  return jax.tree.map(lambda x: unstack_layers(x, num_layers) if held(x) else x, tree,
                      is_leaf=held)


@pytest.mark.parametrize("critic", [False, True])
def test_a_checkpoint_of_the_per_layer_layout_resumes_bit_identically(tmp_path, critic):
  """A step-1 checkpoint rewritten in the per-layer layout that grpo_jax wrote before the
  stacked one became the only one (params, AdamW moments, reference and, for PPO, a separate
  critic's backbone as layers_0 ... layers_{L-1}) is stacked on restore: the resumed run equals
  the uninterrupted one, records and params bit for bit."""
  config = small_tiny_config(steps=3, eval_every=10)
  config.train.checkpoint_every = 1
  if critic:
    config.rl.update(advantage="gae", value_head="separate")
  whole = train(config, str(tmp_path / "whole"), log=lambda *_: None)
  resumed_dir = tmp_path / "resumed"
  train(config, str(resumed_dir), log=lambda *_: None)
  ckpt_dir = resumed_dir / "checkpoints"
  checkpoints = Checkpoints(str(ckpt_dir), keep=10, log=lambda *_: None)
  template = checkpoints.restore(1, whole)
  layers = config.model.num_layers
  old = template.replace(train=template.train.replace(**{
      f: _per_layer(getattr(template.train, f), layers)
      for f in ("params", "opt_state", "ref_params", "value_params")}))
  if critic:  # also written before the learner counted the steps without signal (issue 76):
    # the count starts at 0 again, as it is in a run whose value loss always has a gradient
    old = old.replace(train=old.train.replace(no_signal_updates=None))
  for step in (1, 2, 3):
    shutil.rmtree(ckpt_dir / str(step))
  checkpoints = Checkpoints(str(ckpt_dir), keep=10, log=lambda *_: None)
  assert checkpoints.save(old)
  checkpoints.close()
  meta = open(ckpt_dir / "1" / "default" / "_METADATA").read()
  assert "layers_0" in meta and '"layers"' not in meta.replace('"layers_', "")
  lines = []
  resumed = train(config, str(resumed_dir), log=lines.append)
  assert any("resumed from checkpoint" in str(x) for x in lines), lines
  assert strip(_records(resumed_dir)) == strip(_records(tmp_path / "whole"))
  for a, b in zip(jax.tree.leaves(to_saveable(resumed)), jax.tree.leaves(to_saveable(whole))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
