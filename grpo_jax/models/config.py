"""The shape of a decoder, as a frozen (hashable) dataclass: its family's blocks
(models/families/) and the numbers config.json gives."""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax.numpy as jnp

from grpo_jax.models.rope import check_rope, rope_frequencies


ATTENTION_IMPLS = ("xla", "jax", "cudnn", "pallas")  # model.attention_impl (models/attention.py)
CONTEXT_LAYOUTS = ("contiguous", "zigzag")  # model.context_layout (models/context.py)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of a decoder (names follow HF's config.json)."""

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10_000.0
  # config.json's rope_parameters: the type (models/rope.py ROPE_TYPES) and its other entries as
  # sorted (key, value) pairs (hashable), e.g. llama3's factor, low/high_freq_factor and
  # original_max_position_embeddings.
  rope_type: str = "default"
  rope_scaling: tuple = ()
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = True
  # The family's blocks (models/families/: its norms, MLP, embedding scale and layer), by
  # their registered name: "llama" (Llama, Mistral, Qwen2, Qwen3), "gemma", "qwen3_moe".
  family: str = "llama"
  qkv_bias: bool = False  # Qwen2 has biases on q/k/v.
  qk_norm: bool = False  # Qwen3 RMS-normalises q and k per head.
  # The shared attention's options that config.json sets (Gemma's; 0 = Llama's).
  query_pre_attn_scalar: float = 0.0  # scores scaled by its -1/2 power; 0 = head_dim's
  attn_softcap: float = 0.0  # scores -> c tanh(scores / c) before the mask; 0 = off
  final_softcap: float = 0.0  # the same on the logits
  # Sliding-window attention: a query at slot q sees key slots s with q - s < sliding_window,
  # on the layers that layer_types marks "sliding_attention" (every layer when layer_types is
  # empty); 0 = full attention everywhere. rope_local_theta > 0: those layers' RoPE base
  # (default RoPE; Gemma 3's local layers), the others keep rope_theta and its scaling.
  sliding_window: int = 0
  layer_types: tuple = ()
  rope_local_theta: float = 0.0
  # Multimodal RoPE (family "qwen2_5_vl"): how many of the head's D / 2 frequencies read the
  # temporal, height and width position ids, in turn; () for the other families.
  mrope_section: tuple = ()
  # Mixture of experts (family "qwen3_moe", models/moe.py): every layer's MLP a router over
  # num_experts SwiGLU experts of moe_intermediate_size, each token taking experts_per_token
  # of them (their weights renormalised when norm_topk_prob).
  num_experts: int = 0
  experts_per_token: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  # Positions the checkpoint was trained for (config.json); 0 = no limit (a random model).
  max_position_embeddings: int = 0
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  # Memory, not maths (grpo_jax/models/decoder.py REMAT_POLICIES; grpo_jax/models/scoring.py):
  # what each layer's backward pass recomputes instead of keeping, and how many completion
  # positions at a time are projected onto the vocabulary when scoring (0 = all at once).
  remat: str = "none"
  logits_chunk: int = 0
  # Speed, not maths: the teacher-forced passes' and the prefill's attention, "xla" (ours),
  # "jax" or "cudnn" (jax.nn.dot_product_attention); "auto" = the platform table's
  # (parallel/choices.py), resolved here.
  attention_impl: str = "auto"
  # Speed, not maths: the order of a row's tokens over the mesh's `context` devices,
  # "contiguous" or "zigzag" (the causal load balance; models/context.py); "auto" = the
  # platform table's.
  context_layout: str = "auto"
  # LoRA's s = alpha / r (grpo_jax/models/lora.py): the adapters' scale, used only when the
  # forward is given adapters.
  lora_scale: float = 0.0

  def __post_init__(self):
    from grpo_jax.parallel.choices import choose  # noqa: PLC0415
    # "auto" resolved once, here, by the platform table (parallel/choices.py says why): every
    # ModelConfig holds a dtype (float32 on CPU, bfloat16 on GPU and TPU) and an attention.
    for name in ("compute_dtype", "attention_impl", "context_layout"):
      object.__setattr__(self, name, choose(f"model.{name}", getattr(self, name)))
    if self.context_layout not in CONTEXT_LAYOUTS:
      raise ValueError(f"model.context_layout={self.context_layout!r}; use auto, contiguous or "
                       f"zigzag.")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"model.attention_impl={self.attention_impl!r}; use auto or one of "
                       f"{', '.join(ATTENTION_IMPLS)}.")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
        raise ValueError(f"model.{name}={getattr(self, name)!r}; a decoder needs a whole number "
                         f">= 1 there.")
    if self.head_dim % 2:
      raise ValueError(f"model.head_dim={self.head_dim} is odd; RoPE rotates pairs of a head's "
                       f"dimensions, so use an even head_dim.")
    for name, low in (("rope_theta", ">"), ("rms_norm_eps", ">="), ("sliding_window", ">="),
                      ("query_pre_attn_scalar", ">="), ("attn_softcap", ">="),
                      ("final_softcap", ">="), ("rope_local_theta", ">=")):
      value = getattr(self, name)
      if not (isinstance(value, numbers.Real) and math.isfinite(value)
              and (value > 0 if low == ">" else value >= 0)):
        raise ValueError(f"model.{name}={value!r}; use a finite number {low} 0 there.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"model.num_heads={self.num_heads} is not a multiple of model.num_kv_heads="
          f"{self.num_kv_heads}; grouped-query attention needs heads = kv_heads * group.")
    if bool(self.num_experts) != self.blocks.mixture:
      raise ValueError(f"model.num_experts={self.num_experts} with model.family="
                       f"{self.family!r}, whose MLP {'is' if self.blocks.mixture else 'is not'} "
                       f"a mixture; use family 'qwen3_moe' with num_experts > 0, or 'llama' "
                       f"with 0.")
    if self.num_experts and not (1 <= self.experts_per_token <= self.num_experts and
                                 self.moe_intermediate_size >= 1):
      raise ValueError(f"model.num_experts={self.num_experts} needs 1 <= experts_per_token "
                       f"({self.experts_per_token}) <= num_experts and moe_intermediate_size "
                       f"({self.moe_intermediate_size}) >= 1.")
    object.__setattr__(self, "layer_types", tuple(self.layer_types))
    object.__setattr__(self, "mrope_section", tuple(int(v) for v in self.mrope_section))
    if self.layer_types and len(self.layer_types) != self.num_layers:
      raise ValueError(f"model.layer_types has {len(self.layer_types)} entries for "
                       f"{self.num_layers} layers; give one per layer or none.")
    if set(self.layer_types) - {"sliding_attention", "full_attention"}:
      raise ValueError(f"model.layer_types={self.layer_types}: each is 'sliding_attention' or "
                       f"'full_attention'.")
    if self.rope_type != "default" or self.rope_scaling:
      object.__setattr__(self, "rope_scaling", tuple(sorted(dict(self.rope_scaling).items())))
      check_rope(self.rope_type, dict(self.rope_scaling), self.max_position_embeddings)

  def rope_frequencies(self) -> tuple:
    """(inverse frequencies or None for the default ones, attention factor) for
    attention.rotary_embedding."""
    if self.rope_type == "default":
      return None, 1.0
    return rope_frequencies(self.rope_type, dict(self.rope_scaling), self.rope_theta,
                            self.head_dim, self.max_position_embeddings)

  def sliding_layers(self) -> tuple:
    """Per layer, whether it attends within the sliding window."""
    if not self.sliding_window:
      return (False,) * self.num_layers
    if not self.layer_types:
      return (True,) * self.num_layers
    return tuple(t == "sliding_attention" for t in self.layer_types)

  @property
  def blocks(self):
    """The family's blocks (models/blocks.py Blocks), registered under self.family."""
    from grpo_jax.models.families import BLOCKS  # noqa: PLC0415
    return BLOCKS.get(self.family)

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)

  @classmethod
  def from_config_dict(cls, cfg) -> "ModelConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(cfg).items() if k in fields})
