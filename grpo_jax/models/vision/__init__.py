"""Vision-language families (issue 57): Qwen2.5-VL's vision encoder, multimodal RoPE and image
placeholders, and the whole model's forward pass (qwen2_5_vl_model.py, loading:
qwen2_5_vl_model_hf.py)."""
