"""Model shapes for the compile-only benchmarks (scale.py, lora.py): released checkpoints'
config.json values and the random checkpoints of benchmarks/common.py, as ModelConfig keyword
arguments."""

# Hugging Face config.json values of released checkpoints (Qwen/Qwen2.5-*, SmolLM2).
RELEASED = {
    "qwen2.5-0.5b": dict(vocab_size=151_936, hidden_size=896, num_layers=24, num_heads=14,
                         num_kv_heads=2, head_dim=64, intermediate_size=4864,
                         tie_embeddings=True, qkv_bias=True, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(vocab_size=151_936, hidden_size=1536, num_layers=28, num_heads=12,
                         num_kv_heads=2, head_dim=128, intermediate_size=8960,
                         tie_embeddings=True, qkv_bias=True, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(vocab_size=152_064, hidden_size=3584, num_layers=28, num_heads=28,
                       num_kv_heads=4, head_dim=128, intermediate_size=18_944,
                       tie_embeddings=False, qkv_bias=True, rope_theta=1_000_000.0,
                       rms_norm_eps=1e-6),
    # Qwen/Qwen3-30B-A3B: 48 layers, each a mixture of 128 experts, 8 per token
    "qwen3-30b-a3b": dict(vocab_size=151_936, hidden_size=2048, num_layers=48, num_heads=32,
                          num_kv_heads=4, head_dim=128, intermediate_size=6144,
                          tie_embeddings=False, qk_norm=True, rope_theta=1_000_000.0,
                          rms_norm_eps=1e-6, family="qwen3_moe", num_experts=128, experts_per_token=8,
                          moe_intermediate_size=768, norm_topk_prob=True),
    # HuggingFaceTB/SmolLM2-135M-Instruct (the real model of configs/grpo_smollm2.py)
    "smollm2-135m": dict(vocab_size=49_152, hidden_size=576, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, intermediate_size=1536,
                         tie_embeddings=True, qkv_bias=False, rope_theta=100_000.0,
                         rms_norm_eps=1e-5),
}


def shape_table() -> dict:
  """Every known shape as ModelConfig keyword arguments: RELEASED plus benchmarks/common.SHAPES
  (the random checkpoints: vocab common.VOCAB, tied, q/k/v bias, head_dim = hidden / heads,
  HF's Qwen2Config defaults for theta and eps)."""
  from benchmarks import common
  table = dict(RELEASED)
  for name, s in common.SHAPES.items():
    if name in table:  # qwen2.5-0.5b: the real config above
      continue
    table[name] = dict(vocab_size=common.VOCAB, hidden_size=s["hidden_size"],
                       num_layers=s["num_hidden_layers"], num_heads=s["num_attention_heads"],
                       num_kv_heads=s["num_key_value_heads"],
                       head_dim=s["hidden_size"] // s["num_attention_heads"],
                       intermediate_size=s["intermediate_size"], tie_embeddings=True,
                       qkv_bias=True, rope_theta=10_000.0, rms_norm_eps=1e-6)
  return table
