"""Qwen2.5-VL's vision side: the vision encoder, multimodal RoPE's position ids, the image
placeholders and the Hugging Face loading (qwen2_5_vl*.py), the whole model's forward pass on
models/decoder.py's Decoder (qwen2_5_vl_model.py), and the policy's prompt inputs
(policy.py), with which every engine of rollout/ and the learner's passes run it."""
