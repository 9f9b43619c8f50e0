"""Qwen3-MoE (grpo_jax/models/moe.py) against transformers 5's Qwen3MoeForCausalLM on a tiny
random checkpoint with 4 experts and top-2: logits on a left-padded batch, greedy tokens
against generate, the export's round trip, the grouped (ragged_dot) expert MLP against a
per-expert loop, and the load-balancing loss against transformers' own function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from grpo_jax.models import hf, hf_export
from grpo_jax.models.moe import grouped_expert_mlp, load_balancing_loss, route
from grpo_jax.rollout.sampler import generate
from tests.fixtures import decoder_logits, transformers_logits, xla_env
from tests.test_gemma import EOS, batch


def qwen3_moe(tmp_path, norm_topk_prob=True):
  config = transformers.Qwen3MoeConfig(
      vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
      num_experts=4, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob,
      max_position_embeddings=256, initializer_range=0.2, attn_implementation="eager",
      eos_token_id=EOS, pad_token_id=0, bos_token_id=1)
  torch.manual_seed(0)
  model = transformers.Qwen3MoeForCausalLM(config).eval()
  model.save_pretrained(tmp_path)
  return model


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_logits_equal_transformers_on_a_left_padded_batch(norm_topk_prob, tmp_path):
  model = qwen3_moe(tmp_path, norm_topk_prob)
  model_cfg, params = hf.load_hf_checkpoint(tmp_path)
  assert (model_cfg.num_experts, model_cfg.experts_per_token) == (4, 2)
  assert params["layers"]["mlp"]["experts"]["gate_proj"]["kernel"].shape == (3, 4, 32, 24)
  tokens, mask = batch()
  diff = np.abs(decoder_logits(model_cfg, params, tokens, mask)
                - transformers_logits(model, tokens, mask))
  assert diff[mask].max() <= 1e-4, diff[mask].max()


def test_greedy_tokens_equal_generate_and_export_round_trips(tmp_path):
  model = qwen3_moe(tmp_path / "src")
  model_cfg, params = hf.load_hf_checkpoint(tmp_path / "src")
  tokens, mask = batch()
  out = generate(params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask), jax.random.key(0),
                 model_cfg=model_cfg, max_new_tokens=10, temperature=0.0, eos_id=EOS, pad_id=0)
  with torch.no_grad():
    reference = model.generate(
        input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
        do_sample=False, max_new_tokens=10, eos_token_id=EOS, pad_token_id=0).numpy()
  completions, kept = np.asarray(out.completion_tokens), np.asarray(out.completion_mask)
  for row, ref in enumerate(reference[:, tokens.shape[1]:]):
    ref = list(ref)
    ref = ref[:ref.index(EOS) + 1] if EOS in ref else ref
    assert list(completions[row][kept[row]]) == ref, row
  exported = hf_export.export_hf_checkpoint(params, model_cfg, tmp_path / "out",
                                            model_type="qwen3_moe")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
  np.testing.assert_allclose(transformers_logits(reloaded, tokens, mask)[mask],
                             transformers_logits(model, tokens, mask)[mask], atol=1e-5)
  assert hf.load_hf_checkpoint(exported)[0] == model_cfg


def test_grouped_expert_mlp_equals_a_per_expert_loop():
  rng = np.random.default_rng(0)
  n, h, i, e, k = 11, 6, 5, 4, 2
  x = rng.normal(size=(n, h)).astype(np.float32)
  gate, up = rng.normal(size=(e, h, i)), rng.normal(size=(e, h, i))
  down = rng.normal(size=(e, i, h))
  weights, experts = route(jnp.asarray(rng.normal(size=(n, e))), k, True)
  got = grouped_expert_mlp(jnp.asarray(x), experts, weights, *(jnp.asarray(w, jnp.float32)
                                                               for w in (gate, up, down)), e)
  silu = lambda a: a / (1 + np.exp(-a))  # noqa: E731
  want = np.zeros((n, h))
  for t in range(n):
    for j in range(k):
      ex = int(experts[t, j])
      want[t] += float(weights[t, j]) * (silu(x[t] @ gate[ex]) * (x[t] @ up[ex])) @ down[ex]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_equals_transformers(masked):
  from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 10, 4)).astype(np.float32)  # layers, tokens, experts
  mask = (np.arange(10) >= 3).reshape(2, 5) if masked else None
  theirs = float(load_balancing_loss_func(tuple(torch.from_numpy(x) for x in logits), 4, 2,
                                          None if mask is None else torch.from_numpy(mask)))
  ours = float(load_balancing_loss(jnp.asarray(logits), 2,
                                   None if mask is None else jnp.asarray(mask.reshape(-1))))
  assert abs(ours - theirs) <= 1e-6, (ours, theirs)


@pytest.mark.slow
def test_experts_sharded_over_the_expert_axis_equal_one_device(tmp_path):
  """A mixture on 8 CPU devices with an `expert` mesh axis (experts split over it, rows over
  data x fsdp x expert), routing replayed and the load-balancing loss on: greedy tokens and the
  params after two updates equal the single-device run's (tests/mesh_worker.py moe_main)."""
  import json  # noqa: PLC0415
  import os  # noqa: PLC0415
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = xla_env(8, PYTHONPATH=root)
  path = tmp_path / "moe_mesh.json"
  out = subprocess.run([sys.executable, "tests/mesh_worker.py", "moe", str(path)], cwd=root,
                       env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(path.read_text())
  assert result["params_moved"] > 1e-2  # two real updates
  # (layers, experts, embed, mlp): experts over `expert`, embed over fsdp, mlp over tensor.
  shards = {"(1, 2, 1, 4)": [2, 1, 16, 16], "(2, 1, 2, 2)": [2, 2, 32, 8]}
  for shape, shard in shards.items():
    r = result[shape]
    assert r["greedy_equal"], shape
    assert r["params_max_diff"] <= 1e-5, (shape, r)  # measured 3.5e-6 and 8.2e-6
    assert r["loss"] == pytest.approx(r["ref_loss"], abs=1e-5)
    assert r["expert_kernel_shard"] == shard
