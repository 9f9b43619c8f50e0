"""Model families, one module each: what a family's decoder is made of (its `Blocks`,
models/blocks.py) and how its Hugging Face ``model_type``s read and write config.json and name
their tensors.

Built in: llama.py (llama, mistral, qwen2, qwen3), gemma.py (gemma2, gemma3_text),
qwen3_moe.py and qwen2_5_vl.py (Qwen2.5-VL's text decoder: Qwen2 with mRoPE). A model picks its blocks with model.family (a checkpoint's model_type picks them
itself); the decoder (models/decoder.py) asks them for its norms, MLP, embedding scale and
residual stream and never names a family.

To add a family, write one module, imported through config.imports (or before loading or
exporting), that registers its blocks and, to read and write checkpoints, its model_types:

    class MyBlocks(Blocks):          # override what differs from Llama's
      name = "my_family"
      def layer(self, cfg, attend, mlp): ...

    register_blocks(MyBlocks())
    register_model_family(ModelFamily("my_llama", "MyLlamaForCausalLM", blocks="my_family"))

Its tensors are named after its modules (``model.layers.N.self_attn.q_proj.weight``, ...);
the loader checks names and shapes. tests/plugins/parallel_family.py is such a module.
"""

from grpo_jax.models.families import gemma, llama, qwen2_5_vl, qwen3_moe  # noqa: F401  (the built-ins)
from grpo_jax.models.families.registry import (BLOCKS, MODEL_FAMILIES,  # noqa: F401
                                               ModelFamily, find_model_family, model_types,
                                               register_blocks, register_model_family)
