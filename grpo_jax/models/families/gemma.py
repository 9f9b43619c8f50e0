"""The Gemma family: Gemma 2 and Gemma 3 (text) on the shared decoder (models/decoder.py), as
transformers 5 defines them (Gemma2ForCausalLM, Gemma3ForCausalLM). Its blocks (`GemmaBlocks`)
differ from Llama's in the first four points; the rest are config.json's numbers, which the
shared attention reads (ModelConfig):

  * RMSNorm times (1 + weight), every norm (and Gemma 3's q/k norms);
  * the embeddings times sqrt(hidden_size), in the compute dtype (the tied output projection
    is not scaled);
  * GeGLU: the gate through the tanh-approximated gelu ("gelu_pytorch_tanh");
  * four norms per layer: before and after the attention, before and after the MLP;
  * scores divided by sqrt(query_pre_attn_scalar), not sqrt(head_dim);
  * soft-capping c tanh(x / c) of the attention scores (before the mask) and of the final
    logits (Gemma 2: attn_logit_softcapping, final_logit_softcapping; Gemma 3 has neither);
  * sliding-window attention on the layers that layer_types marks "sliding_attention" (default:
    every other layer from the first for Gemma 2, five of every six for Gemma 3): a query at
    cache slot q sees slots s with q - s < sliding_window, in the teacher-forced passes and in
    the sampler's KV cache alike;
  * Gemma 3: q/k norms, and two RoPE bases: the sliding layers rotate with
    rope_parameters["sliding_attention"] (default RoPE at rope_local_base_freq, 10,000), the
    global ones with rope_parameters["full_attention"] (rope_theta 1,000,000 and its scaling).

The tensors are named like Llama's plus pre_feedforward_layernorm / post_feedforward_layernorm
(and post_attention_layernorm is the attention output's norm). The chat template comes with the
checkpoint's tokenizer files, as for every family.
"""

from __future__ import annotations

from grpo_jax.models.blocks import MLP, Blocks, RMSNorm, gelu_tanh, residual_constrain
from grpo_jax.models.families.registry import ModelFamily, register_blocks, register_model_family

GELU_TANH = "gelu_pytorch_tanh"
SLIDING, FULL = "sliding_attention", "full_attention"


def _activation(hf_config: dict) -> str:
  act = hf_config.get("hidden_activation") or hf_config.get("hidden_act") or GELU_TANH
  if act not in (GELU_TANH, "gelu_tanh"):
    raise ValueError(f"config.json hidden_activation={act!r} is not supported for Gemma; its "
                     f"MLP is GeGLU with {GELU_TANH!r}.")
  return "gelu_tanh"


def _layer_types(hf_config: dict, pattern: int) -> tuple:
  """config.json's layer_types, else transformers' default: sliding unless (i + 1) is a
  multiple of the pattern (Gemma 2: 2; Gemma 3: sliding_window_pattern, 6)."""
  types = hf_config.get("layer_types")
  if types is None:
    layers = int(hf_config["num_hidden_layers"])
    types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
  if set(types) - {SLIDING, FULL}:
    raise ValueError(f"config.json layer_types={types}: each is {SLIDING!r} or {FULL!r}.")
  return tuple(types)


def _common(hf_config: dict, pattern: int = 2) -> dict:  # Gemma 2's fields (pattern 2)
  if hf_config.get("attention_bias"):
    raise ValueError("config.json attention_bias=true is not supported for Gemma.")
  if hf_config.get("use_bidirectional_attention"):
    raise ValueError("config.json use_bidirectional_attention=true is not supported; a causal "
                     "language model attends to the left only.")
  _activation(hf_config)
  return dict(query_pre_attn_scalar=float(hf_config.get("query_pre_attn_scalar") or 256),
              attn_softcap=float(hf_config.get("attn_logit_softcapping") or 0.0),
              final_softcap=float(hf_config.get("final_logit_softcapping") or 0.0),
              sliding_window=int(hf_config.get("sliding_window") or 0),
              layer_types=_layer_types(hf_config, pattern))


def _gemma3_ropes(hf_config: dict) -> tuple[dict, dict]:
  """(the global layers' rope_parameters, the sliding layers') of a Gemma 3 config.json:
  transformers 5's per-layer-type rope_parameters, or the older rope_theta / rope_scaling /
  rope_local_base_freq."""
  rope = hf_config.get("rope_parameters") or {}
  if FULL in rope or SLIDING in rope:
    full = dict(rope.get(FULL) or {"rope_type": "default"})
    local = dict(rope.get(SLIDING) or {"rope_type": "default"})
    full.setdefault("rope_theta", hf_config.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", hf_config.get("rope_local_base_freq", 10_000.0))
  else:
    full = {"rope_type": "default", **(hf_config.get("rope_scaling") or {}), **rope,
            "rope_theta": rope.get("rope_theta", hf_config.get("rope_theta", 1_000_000.0))}
    local = {"rope_type": "default",
             "rope_theta": hf_config.get("rope_local_base_freq", 10_000.0)}
  return full, local


def gemma3_rope_config(hf_config: dict) -> dict:
  return {**hf_config, "rope_parameters": _gemma3_ropes(hf_config)[0], "rope_scaling": None}


def gemma3_fields(hf_config: dict) -> dict:
  local = _gemma3_ropes(hf_config)[1]
  if local.get("rope_type", "default") != "default" or len(set(local) - {"rope_type",
                                                                         "rope_theta"}):
    raise ValueError(f"config.json's sliding layers' rope_parameters {local} are not "
                     f"supported; the local layers take default RoPE (a base only).")
  pattern = int(hf_config.get("sliding_window_pattern") or 6)
  return dict(_common(hf_config, pattern), rope_local_theta=float(local["rope_theta"]))


def _export(model_cfg) -> dict:
  return {"hidden_act": GELU_TANH, "hidden_activation": GELU_TANH,
          "query_pre_attn_scalar": (int(model_cfg.query_pre_attn_scalar)  # transformers: int
                                    if float(model_cfg.query_pre_attn_scalar).is_integer()
                                    else model_cfg.query_pre_attn_scalar),
          "attn_logit_softcapping": model_cfg.attn_softcap or None,
          "final_logit_softcapping": model_cfg.final_softcap or None,
          "sliding_window": model_cfg.sliding_window or None,
          "layer_types": list(model_cfg.layer_types) or [FULL] * model_cfg.num_layers,
          "attention_bias": False}


def gemma3_export(model_cfg) -> dict:
  full = {"rope_type": model_cfg.rope_type, "rope_theta": model_cfg.rope_theta,
          **dict(model_cfg.rope_scaling)}
  local = {"rope_type": "default", "rope_theta": model_cfg.rope_local_theta or
           model_cfg.rope_theta}
  return {**_export(model_cfg), "rope_parameters": {FULL: full, SLIDING: local},
          "rope_local_base_freq": local["rope_theta"], "rope_scaling": None}


class GemmaBlocks(Blocks):
  """(1 + w) RMSNorms, a GeGLU MLP, embeddings times sqrt(hidden_size) and four norms a layer:
  x + post_attn_norm(attn(input_norm(x))), then + post_ff_norm(mlp(pre_ff_norm(.)))."""

  name = "gemma"

  def norm(self, cfg, name):
    return RMSNorm(cfg.rms_norm_eps, cfg.param_dtype, True, name=name)

  def mlp(self, cfg):
    mlp = MLP(cfg, gelu_tanh, name="mlp")
    return lambda h, adapters, routes: mlp(h, adapters)

  def embed_scale(self, cfg):
    return cfg.hidden_size ** 0.5

  def layer(self, cfg, attend, mlp):
    norms = [self.norm(cfg, n) for n in ("input_layernorm", "post_attention_layernorm",
                                         "pre_feedforward_layernorm",
                                         "post_feedforward_layernorm")]

    def stream(x, *attention_inputs):
      h, layer_cache = attend(norms[0](x), *attention_inputs)
      x = residual_constrain(x + norms[1](h))
      return residual_constrain(x + norms[3](mlp(norms[2](x)))), layer_cache
    return stream

  def export_model_type(self, cfg):
    return "gemma3_text" if cfg.qk_norm else "gemma2"


register_blocks(GemmaBlocks())
register_model_family(ModelFamily(
    "gemma2", "Gemma2ForCausalLM", default_head_dim=256, tie_default=True,
    read_extras=_common, write_extras=_export, blocks="gemma"))
register_model_family(ModelFamily(
    "gemma3_text", "Gemma3ForCausalLM", qk_norm=True, default_head_dim=256, tie_default=True,
    read_extras=gemma3_fields, rope_config=gemma3_rope_config, write_extras=gemma3_export,
    blocks="gemma"))
