"""benchmarks/scale_vlm.py (issue 57, must-show 4) at its --tiny shape: each measurement compiles
on abstract inputs and reports compile seconds, memory_analysis bytes and FLOPs."""

import pytest

from benchmarks import scale_vlm

FIELDS = ("compile_s", "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes",
          "argument_gib", "temp_gib", "peak_gib", "gflop", "while_loops", "image_tokens", "seq")


def check(result, what):
  assert result["what"] == what
  for field in FIELDS:
    assert field in result, field
  for field in ("argument_bytes", "output_bytes", "temp_bytes"):
    assert result[field] > 0, (field, result[field])
  assert result["gflop"] > 0 and result["compile_s"] > 0


def test_tiny_prefill_reports_memory_and_flops(capsys):
  results = scale_vlm.main(["--tiny", "--what", "prefill"])
  check(results[0], "prefill")
  assert results[0]["image_tokens"] == 16 and results[0]["seq"] == 16 + 8  # 112 px: 8x8 / 4
  out = capsys.readouterr().out
  assert '"what": "prefill"' in out and "| prefill |" in out


@pytest.mark.slow
def test_tiny_update_frozen_and_trained_vision():
  frozen, trained = scale_vlm.main(["--tiny", "--what", "update_frozen,update_trained"])
  check(frozen, "update_frozen")
  check(trained, "update_trained")
  assert trained["output_bytes"] > frozen["output_bytes"]  # the vision tower's grads too


def test_real_shape_layout_and_config():
  """The real shape's layout without compiling: 448 px -> 32x32 patches -> 256 image tokens."""
  args = scale_vlm.parse_args([])
  cfg = scale_vlm.vlm_config(args)
  assert (cfg.text.num_layers, cfg.text.hidden_size, cfg.vision.depth) == (36, 2048, 32)
  assert cfg.text.tie_embeddings and cfg.mrope_section == (16, 24, 24)
  ids, grid, image_tokens = scale_vlm.prompt_layout(cfg, 16, 448, 256, 256)
  assert image_tokens == 256 and ids.shape == (16, 768)
  assert grid.tolist()[0] == [1, 32, 32]
  assert (ids == cfg.image_token_id).sum(1).tolist() == [256] * 16


def test_bad_image_size_is_refused():
  with pytest.raises(SystemExit):
    scale_vlm.parse_args(["--image", "450"])


def test_tiny_sampler_reports_memory_and_flops():
  pytest.importorskip("grpo_jax.rollout.vlm_sampler")
  (result,) = scale_vlm.main(["--tiny", "--what", "sampler"])
  check(result, "sampler")
  assert result["vision_batch"] == "per_segment" and result["while_loops"] > 0


def test_tiny_rl_step_compiles_the_loops_step():
  """--what rl_step: the learner's RL step (make_rl_step, state donated) with the VLM policy;
  GSM8K's rl section: kl_coef > 0, so the state holds a reference copy of the params."""
  (result,) = scale_vlm.main(["--tiny", "--what", "rl_step"])
  check(result, "rl_step")
  assert result["reference"] and result["kl_coef"] == 0.001
  assert result["seq"] == 16 + 8 + 8 and result["group_size"] == 2  # image + text + new
  # The donated state comes back in place: params, AdamW moments and the reference alias.
  assert result["alias_bytes"] > 0.9 * result["state_gib"] * 2**30
  assert result["while_loops"] > 0


def test_rl_step_rows_must_split_into_micro_batches():
  with pytest.raises(SystemExit):
    scale_vlm.parse_args(["--what", "rl_step", "--rows", "8"])  # 4 x 4 micro-batches


def test_tiny_sampler_loop_is_the_loops_rollout():
  """--what sampler_loop: Sampling.with_stats(..., images=) on rows / G prompts."""
  (result,) = scale_vlm.main(["--tiny", "--what", "sampler_loop"])
  check(result, "sampler_loop")
  assert result["sampler_prompts"] == 1 and result["sampler_group"] == 2
  assert result["while_loops"] > 0
