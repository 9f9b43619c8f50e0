"""A model family written outside the package, loaded by config.imports
(tests/test_families.py): GPT-J / PaLM's parallel layer with one norm,

    x + attn(norm(x)) + mlp(norm(x)),

and a squared-ReLU gated MLP, down(relu(gate(x))^2 * up(x)). Its blocks differ from Llama's
in the layer and the MLP; everything else (attention, RoPE, the KV cache, the scan, scoring,
LoRA, sharding, the Hugging Face edge) is the shared decoder's.

    --config.imports=tests/plugins/parallel_family.py --config.model.family=parallel
"""

import jax.numpy as jnp
import flax.linen as nn

from grpo_jax.models.blocks import MLP, Blocks, residual_constrain
from grpo_jax.models.families import ModelFamily, register_blocks, register_model_family


def relu_squared(x):
  return jnp.square(nn.relu(x))


class ParallelBlocks(Blocks):
  name = "parallel"

  def mlp(self, cfg):
    mlp = MLP(cfg, relu_squared, name="mlp")
    return lambda h, adapters, routes: mlp(h, adapters)

  def layer(self, cfg, attend, mlp):
    norm = self.norm(cfg, "input_layernorm")

    def stream(x, *attention_inputs):
      h = norm(x)
      attended, layer_cache = attend(h, *attention_inputs)
      return residual_constrain(x + attended + mlp(h)), layer_cache
    return stream

  def export_model_type(self, cfg):
    return "parallel_llama"


register_blocks(ParallelBlocks(), replace=True)
register_model_family(ModelFamily("parallel_llama", "ParallelLlamaForCausalLM",
                                  blocks="parallel"), replace=True)
