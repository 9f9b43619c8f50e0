"""Quantised rollout weights (rollout.weight_dtype, grpo_jax/models/quantized.py): qwix's int8
per-channel copy of the layers' kernels, read by the sampler; training stays in full
precision."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix

from grpo_jax.models.quantized import quantize_layers, weight_bytes
from grpo_jax.rollout.sampler import Sampling
from tests.fixtures import perturbed_params, tiny_model_config

PROMPTS = jnp.array([[0, 0, 5, 6, 7, 8], [3, 4, 9, 10, 11, 12], [0, 13, 14, 15, 16, 2]],
                    jnp.int32)


def test_int8_kernels_are_within_half_a_step_of_the_originals_per_output_channel():
  cfg = tiny_model_config(num_layers=3)
  params = perturbed_params(cfg)
  quantized = quantize_layers(params, "int8")
  q_proj = quantized["layers"]["self_attn"]["q_proj"]["kernel"]
  original = np.asarray(params["layers"]["self_attn"]["q_proj"]["kernel"])  # (L, embed, H, D)
  assert isinstance(q_proj, qwix.QArray) and q_proj.qvalue.dtype == jnp.int8
  # One scale per (layer, head, head_dim): absmax over the contracted embed axis / 127.
  expected_scale = np.abs(original).max(axis=1, keepdims=True) / 127.5  # qwix: int8 range 127.5
  np.testing.assert_allclose(np.asarray(q_proj.scale), expected_scale, rtol=1e-6)
  back = np.asarray(qwix.dequantize(q_proj))
  assert np.all(np.abs(back - original) <= expected_scale / 2 + 1e-7)
  o_proj = quantized["layers"]["self_attn"]["o_proj"]["kernel"]  # (L, H, D, embed)
  assert o_proj.scale.shape == (3, 1, 1, cfg.hidden_size)  # contracts heads and head_dim
  # Norms, the embedding and biases are kept as they are.
  assert quantized["embed_tokens"]["embedding"] is params["embed_tokens"]["embedding"]
  assert quantized["layers"]["input_layernorm"]["weight"] is (
      params["layers"]["input_layernorm"]["weight"])
  kernels = [x for x in jax.tree.leaves(params["layers"]) if x.ndim >= 3]
  kernel_bytes = sum(x.size * 4 for x in kernels)
  quantized_kernels = weight_bytes(quantized["layers"]) - (
      weight_bytes(params["layers"]) - kernel_bytes)
  assert quantized_kernels < 0.45 * kernel_bytes  # int8 values + float32 per-channel scales


def test_the_int8_sampler_is_the_full_precision_sampler_on_the_dequantised_weights():
  """rollout.weight_dtype='int8' draws exactly the tokens and log-probs that the full-precision
  sampler draws from the dequantised kernels (the quantisation is the only change), and they
  differ from the original policy's."""
  cfg = tiny_model_config(num_layers=3, vocab_size=20)
  params = perturbed_params(cfg)
  sampling = Sampling(cfg, 8, eos_id=2, pad_id=0).grouped(2)
  int8 = sampling.quantized("int8")(params, PROMPTS, PROMPTS != 0, jax.random.key(4))
  layers = jax.tree.map(lambda x: qwix.dequantize(x) if isinstance(x, qwix.QArray) else x,
                        quantize_layers(params, "int8")["layers"],
                        is_leaf=lambda x: isinstance(x, qwix.QArray))
  reference = sampling({**params, "layers": layers}, PROMPTS, PROMPTS != 0,
                       jax.random.key(4))
  full = sampling(params, PROMPTS, PROMPTS != 0, jax.random.key(4))
  np.testing.assert_array_equal(int8.completion_tokens, reference.completion_tokens)
  np.testing.assert_allclose(int8.logprobs, reference.logprobs, atol=1e-6)
  mask = np.asarray(full.completion_mask) & np.asarray(int8.completion_mask)
  gap = np.abs(np.asarray(int8.logprobs) - np.asarray(full.logprobs))[mask]
  assert 1e-4 < gap.mean() < 0.2, gap.mean()


def test_a_bad_weight_dtype_is_one_sentence():
  with pytest.raises(ValueError, match=r"rollout.weight_dtype='int4'; use '' \(full "):
    quantize_layers(perturbed_params(tiny_model_config()), "int4")


def test_an_moe_run_with_int8_rollouts_reports_the_routing_mismatch(tmp_path):
  """A tiny MoE GRPO run whose rollouts read int8 weights reports the routing mismatch between
  the sampler and the float32 trainer, and the log-prob gap the quantisation opens."""
  import json  # noqa: PLC0415

  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  from tests.fixtures import small_tiny_config  # noqa: PLC0415
  config = small_tiny_config(steps=2, num_minibatches=1)
  config.model.update(dict(family="qwen3_moe", num_experts=4, experts_per_token=2,
                           moe_intermediate_size=32, norm_topk_prob=True))
  config.rollout.weight_dtype = "int8"
  config.rl.tis_cap = 2.0
  train(config, str(tmp_path), log=lambda *a: None)
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f if '"routing_mismatch"' in line]
  assert len(records) == 2
  # Measured: mismatch 0.0 (this tiny model's routers separate its experts by more than int8
  # moves the hidden states; tests/test_routing_replay.py makes near-ties flip), gap 7e-4.
  assert all(0.0 <= r["routing_mismatch"] <= 1.0 for r in records), records
  assert all(r["sampler_logprob_gap"] > 1e-4 for r in records), records
