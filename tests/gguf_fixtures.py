"""Tiny GGUF files made offline the way llama.cpp's convert_hf_to_gguf.py writes a Llama: the
`llama.*` metadata, a gpt2-style BPE tokenizer with a ChatML template, q/k rows permuted for
llama.cpp's RoPE, 2-d weights in one tensor type (gguf.quants.quantize), norms in F32."""

import json

import gguf
import numpy as np

from tests.hf_fixtures import CHATML, save_tiny_tokenizer

# The tensor types a test file is written in (all of them quantize with gguf's NumPy code).
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
# Hugging Face Llama names -> llama.cpp's (written out here, independently of the importer).
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
  """convert_hf_to_gguf.py's LlamaModel.permute (n_head: q heads for q, kv heads for k)."""
  return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
          .swapaxes(1, 2).reshape(weights.shape))


def gguf_name(hf_name: str) -> str:
  if hf_name in TOP:
    return TOP[hf_name]
  _, _, layer, rest = hf_name.split(".", 3)
  return f"blk.{layer}.{LAYER[rest.rsplit('.', 1)[0]]}.weight"


def tokenizer_metadata(directory):
  """(tokens, token types, merges) of the tiny BPE tokenizer saved in directory."""
  data = json.loads((directory / "tokenizer.json").read_text())
  vocab = dict(data["model"]["vocab"])
  specials = {t["content"]: t["id"] for t in data["added_tokens"]}
  vocab.update(specials)
  tokens = [None] * len(vocab)
  for token, index in vocab.items():
    tokens[index] = token
  types = [3 if t in specials else 1 for t in tokens]  # 3: CONTROL, 1: NORMAL
  merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
  return tokens, types, merges


def tiny_llama(vocab_size: int, tie: bool, seed: int = 0, rope_parameters=None):
  """A random float32 transformers Llama (GQA) whose norm weights are not ones."""
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415
  torch.manual_seed(seed)
  config = transformers.LlamaConfig(
      vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, rope_theta=500_000.0, rms_norm_eps=1e-5,
      max_position_embeddings=256, tie_word_embeddings=tie, initializer_range=0.1,
      **({"rope_parameters": rope_parameters} if rope_parameters else {}))
  model = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
  return model


def write_tiny_gguf(path, qtype: str = "F32", tie: bool = True, seed: int = 0,
                    arch: str = "llama", norm_dtype=np.float32, rope_parameters=None,
                    rope_factors=None):
  """Writes a tiny Llama GGUF at path (2-d weights as qtype; rope_factors, when given, as its
  rope_freqs tensor); returns the transformers model it was made from (with
  rope_parameters)."""
  tok_dir = path.parent / f"{path.stem}_tokenizer"
  tok_dir.mkdir(parents=True, exist_ok=True)
  tokenizer = save_tiny_tokenizer(tok_dir, vocab_size=320)
  tokens, types, merges = tokenizer_metadata(tok_dir)
  model = tiny_llama(len(tokens), tie, seed, rope_parameters)
  cfg = model.config
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_name("tiny-llama")
  writer.add_context_length(cfg.max_position_embeddings)
  writer.add_embedding_length(cfg.hidden_size)
  writer.add_block_count(cfg.num_hidden_layers)
  writer.add_feed_forward_length(cfg.intermediate_size)
  writer.add_head_count(cfg.num_attention_heads)
  writer.add_head_count_kv(cfg.num_key_value_heads)
  writer.add_rope_freq_base(500_000.0)
  writer.add_layer_norm_rms_eps(1e-5)
  writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
  writer.add_vocab_size(len(tokens))
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("smollm")
  writer.add_token_list(tokens)
  writer.add_token_types(types)
  writer.add_token_merges(merges)
  writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
  writer.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
  writer.add_pad_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
  writer.add_add_bos_token(False)
  writer.add_chat_template(CHATML)
  qt = gguf.GGMLQuantizationType[qtype]
  if rope_factors is not None:
    writer.add_tensor("rope_freqs.weight", np.asarray(rope_factors, np.float32))
  for name, tensor in model.state_dict().items():
    if tie and name == "lm_head.weight":
      continue
    w = tensor.float().numpy()
    if name.endswith("q_proj.weight"):
      w = llama_cpp_permute(w, cfg.num_attention_heads)
    elif name.endswith("k_proj.weight"):
      w = llama_cpp_permute(w, cfg.num_key_value_heads)
    if w.ndim == 1:
      writer.add_tensor(gguf_name(name), w.astype(norm_dtype))
    else:
      writer.add_tensor(gguf_name(name), gguf.quants.quantize(w, qt), raw_dtype=qt)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return model
