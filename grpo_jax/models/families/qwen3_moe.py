"""The Qwen3-MoE family: Qwen3's attention (q/k norms) on Llama's pre-norm layers, every
layer's MLP a mixture of SwiGLU experts (models/moe.py), as transformers 5 defines
Qwen3MoeForCausalLM; its config.json fields and its per-expert tensor names."""

from __future__ import annotations

from grpo_jax.models.blocks import Blocks
from grpo_jax.models.families.registry import ModelFamily, register_blocks, register_model_family
from grpo_jax.models.moe import MoE


def qwen3_moe_fields(hf_config: dict) -> dict:
  """The mixture's ModelConfig fields of a Qwen3-MoE config.json (every layer sparse)."""
  if hf_config.get("hidden_act", "silu") != "silu":
    raise ValueError(f"config.json hidden_act={hf_config['hidden_act']!r} is not supported; "
                     f"the experts are SwiGLU (hidden_act='silu').")
  if hf_config.get("use_sliding_window") or hf_config.get("attention_bias"):
    raise ValueError("config.json use_sliding_window / attention_bias are not supported for "
                     "qwen3_moe; use a checkpoint with full attention and no o_proj bias.")
  if hf_config.get("mlp_only_layers") or int(hf_config.get("decoder_sparse_step", 1)) != 1:
    raise ValueError(f"config.json mlp_only_layers={hf_config.get('mlp_only_layers')} / "
                     f"decoder_sparse_step={hf_config.get('decoder_sparse_step')}: only "
                     f"checkpoints whose every layer is sparse (Qwen3-MoE's own) are supported.")
  experts = hf_config.get("num_experts") or hf_config.get("num_local_experts")
  if not experts:
    raise ValueError("config.json of a qwen3_moe checkpoint has no num_experts; use the "
                     "config.json that came with the checkpoint.")
  return dict(num_experts=int(experts),
              experts_per_token=int(hf_config["num_experts_per_tok"]),
              moe_intermediate_size=int(hf_config["moe_intermediate_size"]),
              norm_topk_prob=bool(hf_config.get("norm_topk_prob", False)))


def qwen3_moe_export(model_cfg) -> dict:
  return {"num_experts": model_cfg.num_experts, "num_local_experts": model_cfg.num_experts,
          "num_experts_per_tok": model_cfg.experts_per_token,
          "moe_intermediate_size": model_cfg.moe_intermediate_size,
          "norm_topk_prob": model_cfg.norm_topk_prob, "decoder_sparse_step": 1,
          "mlp_only_layers": [], "attention_bias": False, "use_sliding_window": False}


class MixtureBlocks(Blocks):
  """Llama's blocks with a mixture of experts as every layer's MLP (models/moe.py MoE): the
  router's choice is sown for routing replay, replayed experts come in as routes, and the
  experts take no LoRA adapters."""

  name = "qwen3_moe"
  mixture = True

  def mlp(self, cfg):
    moe = MoE(cfg, name="mlp")
    return lambda h, adapters, routes: moe(h, routes)

  def every_param(self):
    return dict(num_experts=2, experts_per_token=1, moe_intermediate_size=4)

  def per_expert(self, path):
    return "experts" in path  # transformers' checkpoints: model.layers.N.mlp.experts.E....

  def export_model_type(self, cfg):
    return "qwen3_moe"


register_blocks(MixtureBlocks())
register_model_family(ModelFamily(
    "qwen3_moe", "Qwen3MoeForCausalLM", qk_norm=True, default_head_dim=128,
    read_extras=qwen3_moe_fields, write_extras=qwen3_moe_export, blocks="qwen3_moe"))
