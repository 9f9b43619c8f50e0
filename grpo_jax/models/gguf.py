"""GGUF files (llama.cpp's format) -> a Hugging Face checkpoint folder that our loader
(grpo_jax/models/hf.py), our tokenizer loader and transformers all read:

    python -m grpo_jax.models.gguf FILE.gguf --out DIR [--dtype float32|bfloat16|float16]

writes DIR/model.safetensors (sharded with an index past SHARD_BYTES; tied models store no
lm_head.weight), config.json (a LlamaForCausalLM built from the file's `llama.*` metadata),
generation_config.json and the tokenizer (tokenizer.json, tokenizer_config.json,
chat_template.jinja). Python: `import_gguf(gguf_path, out_dir, dtype)`.

Weights are read and dequantized by the `gguf` package (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_*,
the K-quants: whatever its NumPy `dequantize` implements), one tensor at a time, to float32 and
then `dtype`. llama.cpp's converter permutes the rows of the q and k projections for its RoPE
layout (pairs (2i, 2i+1) instead of halves (i, i + d/2)); that is undone here. The tokenizer is
transformers' own GGUF conversion (`convert_gguf_tokenizer`) fed with the metadata read here, so
no torch is needed (transformers' `from_pretrained(gguf_file=...)` path imports torch); with a
transformers that lacks that module, its `AutoTokenizer.from_pretrained(gguf_file=...)` is used.

Only the `llama` architecture (Llama, SmolLM, Mistral without sliding window, ...) with
default RoPE, or Llama 3.x's (its rope_freqs tensor read back as rope_type llama3), is
imported; anything else is one InputError sentence.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

from grpo_jax.errors import InputError, cli_status, first_line
from grpo_jax.models.rope import llama3_parameters_from_factors

DTYPES = ("float32", "bfloat16", "float16")
SHARD_BYTES = 4 << 30  # one model.safetensors up to 4 GiB, shards of at most this beyond
TESTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
# GGUF tensor names (after "blk.N.") -> Hugging Face Llama names (after "model.layers.N.").
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
             "output": "lm_head"}


# ----------------------------------------------------------------------------- metadata


def read_metadata(reader) -> dict:
  """{key: value} of a GGUFReader's metadata (strings, numbers, lists), without GGUF.* keys."""
  return {name: field.contents() for name, field in reader.fields.items()
          if not name.startswith("GGUF.")}


def _float32(value) -> float:
  """A float32 metadata value as the shortest decimal that is the same float32 (1e-05, not
  9.999999747378752e-06)."""
  return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def hf_config_from_gguf(metadata: dict, tensor_names, gguf_path, dtype: str = "float32",
                        rope_factors=None) -> dict:
  """config.json (LlamaForCausalLM) from a llama GGUF's metadata (and its rope_freqs tensor,
  `rope_factors`, Llama 3.x's RoPE scaling as llama.cpp stores it: read back as rope_type
  llama3); raises InputError on an architecture or feature our decoder does not have."""
  arch = metadata.get("general.architecture")
  if arch != "llama":
    raise InputError(f"{gguf_path} holds architecture {arch!r}; only 'llama' GGUF files (Llama, "
                     f"SmolLM, Mistral without sliding window) can be imported.")

  def get(key, default=None):
    value = metadata.get(f"llama.{key}", default)
    if value is None:
      raise InputError(f"{gguf_path} has no llama.{key} in its metadata; use a GGUF written by "
                       f"llama.cpp's convert_hf_to_gguf.py.")
    return value

  heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
  head_dim = int(metadata.get("llama.attention.key_length", hidden // heads))
  rope_dim = metadata.get("llama.rope.dimension_count", head_dim)
  scaling = metadata.get("llama.rope.scaling.type", "none")
  unsupported = ((f"llama.expert_count={metadata['llama.expert_count']} (mixture of experts)"
                  if metadata.get("llama.expert_count") else None) or
                 (f"llama.rope.dimension_count={rope_dim} != head dim {head_dim} (partial RoPE)"
                  if rope_dim != head_dim else None) or
                 (f"llama.rope.scaling.type={scaling!r}" if scaling != "none" else None) or
                 (f"llama.attention.value_length={metadata['llama.attention.value_length']} != "
                  f"key_length {head_dim}" if metadata.get("llama.attention.value_length",
                                                           head_dim) != head_dim else None))
  if unsupported:
    raise InputError(f"{gguf_path} uses {unsupported}, which the decoder does not support; "
                     f"import a plain Llama-architecture GGUF with default RoPE.")
  vocab = metadata.get("llama.vocab_size") or len(metadata.get("tokenizer.ggml.tokens") or ())
  if not vocab:
    raise InputError(f"{gguf_path} has neither llama.vocab_size nor tokenizer.ggml.tokens; use "
                     f"a GGUF written by llama.cpp's convert_hf_to_gguf.py.")
  theta = _float32(metadata.get("llama.rope.freq_base", 10_000.0))
  rope = {}
  if rope_factors is not None:
    rope = llama3_parameters_from_factors(rope_factors, theta, head_dim)
    if rope is None:
      raise InputError(f"{gguf_path} has a rope_freqs tensor (divisors {np.min(rope_factors):g} "
                       f"to {np.max(rope_factors):g}) that matches no llama3 RoPE scaling; "
                       f"import a Llama GGUF with default or Llama 3.x RoPE.")
  config = {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": int(vocab),
      "hidden_size": hidden, "intermediate_size": int(get("feed_forward_length")),
      "num_hidden_layers": int(get("block_count")), "num_attention_heads": heads,
      "num_key_value_heads": int(metadata.get("llama.attention.head_count_kv", heads)),
      "head_dim": head_dim, "hidden_act": "silu",
      "rms_norm_eps": _float32(get("attention.layer_norm_rms_epsilon")),
      "rope_parameters": {"rope_type": "default", "rope_theta": theta, **rope},
      "rope_theta": theta,
      "tie_word_embeddings": "output.weight" not in tensor_names,
      "attention_bias": False, "mlp_bias": False, "dtype": dtype}
  if metadata.get("llama.context_length"):
    config["max_position_embeddings"] = int(metadata["llama.context_length"])
  config.update(special_token_ids(metadata))
  return config


def special_token_ids(metadata: dict) -> dict:
  """{bos,eos,pad}_token_id from the tokenizer metadata (those present)."""
  keys = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
          "pad_token_id": "padding_token_id"}
  return {name: int(metadata[f"tokenizer.ggml.{key}"]) for name, key in keys.items()
          if metadata.get(f"tokenizer.ggml.{key}") is not None}


def _layer_numbers(tensor_names) -> list:
  """The N of each blk.N.* tensor name, sorted, once each."""
  return sorted({int(name.split(".")[1]) for name in tensor_names
                 if name.startswith("blk.") and name.split(".")[1].isdigit()})


def _sizes_in_tensors(shapes: dict) -> dict:
  """{llama metadata key: (the size the tensors have, where it is read)} for the sizes a
  tensor's shape fixes (GGUF shapes list the columns first)."""
  layers = _layer_numbers(shapes)
  found = {"block_count": (len(layers), f"holds tensors of {len(layers)} layers"
                           + (f" (blk.0 to blk.{layers[-1]})" if layers else ""))}
  if "token_embd.weight" in shapes:
    hidden, vocab = shapes["token_embd.weight"]
    found["embedding_length"] = (hidden, f"its token_embd.weight is {hidden} wide")
    found["vocab_size"] = (vocab, f"its token_embd.weight has {vocab} rows")
  if "blk.0.ffn_up.weight" in shapes:
    ffn = shapes["blk.0.ffn_up.weight"][1]
    found["feed_forward_length"] = (ffn, f"its blk.0.ffn_up.weight has {ffn} rows")
  return found


def check_metadata_matches_tensors(metadata: dict, tensors, gguf_path) -> None:
  """Raises InputError when llama.block_count, embedding_length, feed_forward_length or
  vocab_size disagrees with the tensors the file holds (an edited or damaged header), or the
  layers are not numbered 0 to n-1; checked before the other metadata, whose checks (head dim,
  RoPE) would otherwise misname the fault."""
  shapes = {t.name: tuple(int(d) for d in t.shape) for t in tensors}
  layers = _layer_numbers(shapes)
  if layers != list(range(len(layers))):
    raise InputError(f"{gguf_path} holds tensors of layers {layers}, not numbered 0 to "
                     f"{len(layers) - 1}; the file is damaged: convert the model again.")
  for key, (size, where) in _sizes_in_tensors(shapes).items():
    value = metadata.get(f"llama.{key}")
    if isinstance(value, (int, np.integer)) and int(value) != size:
      raise InputError(f"{gguf_path} has llama.{key}={int(value)} but {where}; its metadata "
                       f"disagrees with its weights: set the key to {size} (gguf-set-metadata "
                       f"{gguf_path} llama.{key} {size}) or convert the model again with "
                       f"llama.cpp's convert_hf_to_gguf.py.")


# ----------------------------------------------------------------------------- tensors


def hf_name(gguf_name: str, gguf_path) -> str:
  """A GGUF tensor name -> its Hugging Face Llama name (InputError for one we have no place
  for)."""
  parts = gguf_name.split(".")
  if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_NAMES and parts[3] == "weight":
    return f"model.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}.weight"
  if len(parts) == 2 and parts[0] in TOP_NAMES and parts[1] == "weight":
    return f"{TOP_NAMES[parts[0]]}.weight"
  raise InputError(f"{gguf_path} has tensor {gguf_name}, which a plain Llama decoder has no "
                   f"parameter for; import a plain Llama-architecture GGUF.")


def unpermute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of llama.cpp's q/k row permutation, `w.reshape(n_head, 2, rows // n_head // 2,
  cols).swapaxes(1, 2)` (n_head: q heads for q, kv heads for k)."""
  rows = weight.shape[0]
  return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2)
          .reshape(weight.shape))


def dequantized(tensor, gguf_path) -> np.ndarray:
  """One GGUFReader tensor as float32 in torch's (rows, cols) order."""
  import gguf  # noqa: PLC0415
  kind = tensor.tensor_type.name
  try:
    array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  except NotImplementedError:
    from importlib.metadata import version  # noqa: PLC0415
    raise InputError(
        f"{gguf_path} stores tensor {tensor.name} as {kind}, which gguf "
        f"{version('gguf')} cannot dequantize; import a GGUF of {', '.join(TESTED_TYPES)} "
        f"(or another type gguf's dequantize implements).") from None
  return np.asarray(array, np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))


def hf_tensors(reader, config: dict, gguf_path):
  """Yields (HF name, float32 array in torch's layout) for each parameter tensor of the file
  (rope_freqs, read into config.json, is none)."""
  for tensor in weight_tensors(reader):
    name = hf_name(tensor.name, gguf_path)
    array = dequantized(tensor, gguf_path)
    if name.endswith("self_attn.q_proj.weight"):
      array = unpermute_rows(array, config["num_attention_heads"])
    elif name.endswith("self_attn.k_proj.weight"):
      array = unpermute_rows(array, config["num_key_value_heads"])
    yield name, array


def write_safetensors(named_arrays, out_dir: pathlib.Path, dtype: str) -> None:
  """model.safetensors, or model-0000i-of-0000n.safetensors + index past SHARD_BYTES
  (hf_export.save_shards); holds one shard in memory at a time."""
  from grpo_jax.models.hf_export import export_dtype, save_shards  # noqa: PLC0415
  np_dtype = export_dtype(dtype)
  save_shards(((name, np.ascontiguousarray(array.astype(np_dtype)))
               for name, array in named_arrays), out_dir, SHARD_BYTES)


# ----------------------------------------------------------------------------- tokenizer


# tokenizer_config's special tokens and the tokenizer.ggml.* keys of their ids
SPECIAL_TOKENS = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                  ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id"))


def gguf_tokenizer(metadata: dict, gguf_path: pathlib.Path):
  """The file's tokenizer with its chat template (transformers' conversion), or None when the
  file has no tokenizer metadata."""
  if "tokenizer.ggml.model" not in metadata:
    return None
  count = len(metadata.get("tokenizer.ggml.tokens", ()))
  for _, key in SPECIAL_TOKENS:
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    if token_id is not None and not 0 <= int(token_id) < count:
      raise InputError(f"{gguf_path} has tokenizer.ggml.{key}={token_id} but only {count} "
                       f"tokens; its metadata disagrees with its token list: set the key to a "
                       f"token id (gguf-set-metadata {gguf_path} tokenizer.ggml.{key} ID) or "
                       f"convert the model again with llama.cpp's convert_hf_to_gguf.py.")
  import transformers  # noqa: PLC0415
  try:
    try:
      from transformers.integrations.gguf.gguf_tokenizer_mapping import (  # noqa: PLC0415
          GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)
    except ImportError:  # an older transformers: its own path (which needs torch there)
      return transformers.AutoTokenizer.from_pretrained(
          str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True)
    return _tokenizer(metadata, GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)
  except (ImportError, ValueError, KeyError, TypeError, OSError) as e:
    raise InputError(f"the tokenizer of {gguf_path} cannot be converted by transformers "
                     f"{transformers.__version__} ({first_line(e)}); import a GGUF whose "
                     f"tokenizer.ggml.model transformers supports.") from None


def _tokenizer(metadata: dict, mapping: dict, convert):
  """transformers' GGUF tokenizer, as `get_gguf_tokenizer` + `convert_gguf_tokenizer` build it
  from the file (its grouping of the metadata into tokenizer and tokenizer_config keys)."""
  import transformers  # noqa: PLC0415
  grouped = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                     if f"tokenizer.{key}" in metadata}
             for group, renames in mapping.items()}
  tokenizer_dict, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
  if tokenizer_dict.get("tokenizer_type") == "llama":  # sentencepiece files add BOS by default
    tokenizer_config.setdefault("add_bos_token", True)
  tokens = tokenizer_dict["tokens"]
  for name, key in SPECIAL_TOKENS:
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    tokenizer_config[name] = tokens[int(token_id)] if token_id is not None else None
  backend, extra = convert(metadata["general.architecture"], tokenizer_dict)
  return transformers.PreTrainedTokenizerFast(tokenizer_object=backend,
                                              **{**tokenizer_config, **extra})


# ----------------------------------------------------------------------------- import


def _reader(gguf_path: pathlib.Path):
  """gguf.GGUFReader(gguf_path), or one InputError sentence."""
  if not gguf_path.is_file():
    raise InputError(f"No GGUF file at {gguf_path}; pass the path of a .gguf file.")
  import gguf  # noqa: PLC0415
  try:
    return gguf.GGUFReader(str(gguf_path))
  except (ValueError, OSError, KeyError, IndexError) as e:
    raise InputError(f"{gguf_path} cannot be read as GGUF ({first_line(e)}): it is truncated or "
                     f"not a GGUF file; download it again.") from None


ROPE_FREQS = "rope_freqs.weight"


def weight_tensors(reader) -> list:
  return [t for t in reader.tensors if t.name != ROPE_FREQS]


def import_gguf(gguf_path, out_dir, dtype: str = "float32") -> pathlib.Path:
  """Writes the llama GGUF at gguf_path as a Hugging Face checkpoint folder out_dir (weights in
  `dtype`, config, generation config, tokenizer); returns out_dir. Everything is checked
  before anything is written."""
  gguf_path, out_dir = pathlib.Path(gguf_path), pathlib.Path(out_dir)
  if dtype not in DTYPES:
    raise InputError(f"dtype={dtype!r} is not supported; pass one of {', '.join(DTYPES)}.")
  reader = _reader(gguf_path)
  metadata = read_metadata(reader)
  if int(metadata.get("split.count") or 1) > 1:
    raise InputError(f"{gguf_path} is one of {metadata['split.count']} split files; merge them "
                     f"first with `llama-gguf-split --merge {gguf_path.name} merged.gguf`.")
  names = [t.name for t in reader.tensors]
  check_metadata_matches_tensors(metadata, reader.tensors, gguf_path)
  factors = [dequantized(t, gguf_path) for t in reader.tensors if t.name == ROPE_FREQS]
  try:
    config = hf_config_from_gguf(metadata, names, gguf_path, dtype,
                                 factors[0].reshape(-1) if factors else None)
  except InputError:
    raise
  except (TypeError, ValueError) as e:  # a per-layer list where a number belongs, and such
    raise InputError(f"{gguf_path} has llama metadata the importer cannot read "
                     f"({first_line(e)}); import a plain Llama-architecture GGUF.") from None
  for tensor in weight_tensors(reader):  # names and types, before writing anything
    hf_name(tensor.name, gguf_path)
    dequantized_first_row(tensor, gguf_path)
  tokenizer = gguf_tokenizer(metadata, gguf_path)
  out_dir.mkdir(parents=True, exist_ok=True)
  write_safetensors(hf_tensors(reader, config, gguf_path), out_dir, dtype)
  (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  generation = {**special_token_ids(metadata), "_from_model_config": True}
  (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
  if tokenizer is not None:
    tokenizer.save_pretrained(str(out_dir))
  else:
    print(f"note: {gguf_path} has no tokenizer metadata; copy the model's tokenizer files into "
          f"{out_dir}.", file=sys.stderr)
  return out_dir


def dequantized_first_row(tensor, gguf_path) -> None:
  """Raises the InputError of `dequantized` for a type gguf cannot dequantize, cheaply."""
  import gguf  # noqa: PLC0415
  try:
    gguf.quants.dequantize(tensor.data[:1], tensor.tensor_type)
  except NotImplementedError:
    dequantized(tensor, gguf_path)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m grpo_jax.models.gguf",
      description="Write a llama GGUF file as a Hugging Face checkpoint folder.")
  parser.add_argument("gguf_file", help="the .gguf file")
  parser.add_argument("--out", required=True, help="the folder to write")
  parser.add_argument("--dtype", choices=DTYPES, default="float32",
                      help="the weights' dtype in model.safetensors (default float32)")
  args = parser.parse_args(argv)
  return cli_status(lambda: print(import_gguf(args.gguf_file, args.out, args.dtype)))


if __name__ == "__main__":
  sys.exit(main())
