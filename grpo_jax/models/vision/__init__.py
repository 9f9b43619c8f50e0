"""Vision-language families (issue 57): Qwen2.5-VL's vision encoder, multimodal RoPE and image
placeholders."""
