"""Vision-language families (issue 57): Qwen2.5-VL's vision encoder, multimodal RoPE and image
placeholders, and the whole model's forward pass (qwen2_5_vl_model.py, loading:
qwen2_5_vl_model_hf.py); the KV-cached sampler and the teacher-forced log-probs of the update
(rollout/vlm_sampler.py, on the cached decoder of qwen2_5_vl_cached.py)."""
