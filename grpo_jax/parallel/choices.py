"""The platform table: every setting whose best value depends on the accelerator, in one place,
keyed by jax's backend ("cpu", "gpu", "tpu"). A config field set to "auto" takes its value here
(`choose`), so a CPU habit never becomes a GPU default by accident: each entry says what
measured it, or that nothing has yet (then `benchmarks/accelerator_check.py` measures the
alternatives on the device, and the entry changes with its figures in benchmarks/RESULTS.md).

| setting                   | cpu            | gpu            | tpu            |
|---------------------------|----------------|----------------|----------------|
| model.compute_dtype       | float32        | bfloat16       | bfloat16       |
| model.attention_impl      | xla            | xla            | pallas         |
| model.context_layout      | contiguous     | contiguous     | zigzag         |
| rollout.decode_loop       | segments       | bounded        | bounded        |
| rollout.refill_shrink     | 0.75           | 0.5            | 0.5            |
| train.compilation_cache   | off            | on             | on             |

(train.compilation_cache's "auto" lives in parallel/platform.compilation_cache_dir.)
"""

from __future__ import annotations

# setting -> {platform: (value, why)}
PLATFORM_TABLE = {
    "model.compute_dtype": {
        "cpu": ("float32", "measured: XLA:CPU's bfloat16 matmuls are slower than float32 on "
                           "this project's 2-core AVX-512 CPU (SmolLM2's GRPO step 72-73 s "
                           "against 67-69 s)"),
        "gpu": ("bfloat16", "the tensor cores' rate; the float32 master params stay float32"),
        "tpu": ("bfloat16", "the MXU's native input type"),
    },
    # Teacher-forced passes and the prefill: "xla" = models/attention.py (grouped-query
    # products, causal query blocks); "cudnn" = jax.nn.dot_product_attention's cuDNN fused
    # kernel (GPU, bfloat16/float16); "jax" = jax.nn.dot_product_attention's XLA form;
    # "pallas" = jax's Pallas TPU flash attention kernel (attention.tpu_flash_attention; TPU
    # only; a model with soft-capping or a sliding window keeps "xla"'s arithmetic), and with
    # mesh.context > 1 its splash kernel over split rows (context.tpu_splash_context_attention,
    # the teacher-forced passes and the prefill). Decode
    # keeps the XLA path on every platform: jax's ragged paged attention kernel reads a paged
    # KV pool (pages and page tables), and the sampler's cache is one contiguous
    # (B, kv_heads, head_dim, S) block per layer (models/kv_cache.py).
    "model.attention_impl": {
        "cpu": ("xla", "measured: the causal query blocks beat one-pass attention on the CPU "
                       "(RESULTS: 'Attention one row at a time'), and jax.nn's XLA form has "
                       "no query blocks"),
        "gpu": ("xla", "not measured yet: accelerator_check.py times 'cudnn' against it (cuDNN's "
                       "kernel does not lower on a host without cuDNN, so CI lowers this one)"),
        "tpu": ("pallas", "not timed: no TPU lent. The flash kernel keeps a pass's memory "
                          "linear in the row's length (its own backward recomputes the scores), "
                          "where the XLA path holds each layer's (T x T) scores; the RL step, "
                          "the sampler and the evaluation lower with it for TPU in CI "
                          "(tests/test_lowering.py)"),
    },
    # The order of a row's tokens over the mesh's context devices (models/context.py).
    "model.context_layout": {
        "cpu": ("contiguous", "XLA's split attention computes every (query, key) pair, so no "
                              "layout has less work on any device; contiguous skips two "
                              "gathers per pass"),
        "gpu": ("contiguous", "as on the CPU: the XLA path (cuDNN's kernel does not split "
                              "rows)"),
        "tpu": ("zigzag", "counted, not timed: the splash kernel skips the key blocks that the "
                          "causal mask hides; at 1k + 32k tokens over 8 devices the busiest "
                          "device runs 8,184 blocks contiguous (1.87x the mean), 4,488 zigzag "
                          "(1.01x) (benchmarks/context_balance.py)"),
    },
    # The static engine's decode loop (rollout/engine.py DECODE_LOOPS).
    "rollout.decode_loop": {
        "cpu": ("segments", "measured: 1,450 against 1,265 decode tokens/s (qwen2-8L-512, "
                            "64 rows, prompt 192, 256 new; XLA:CPU copies each block a "
                            "bounded read takes)"),
        "gpu": ("bounded", "one compiled decode step whatever the segments: the sampler's "
                           "first call at the 0.5B shape did not finish in 320 s on an H200 "
                           "with one compiled step per segment; its steady rate is not "
                           "measured yet (accelerator_check.py times both)"),
        "tpu": ("bounded", "as on the GPU (not measured)"),
    },
    # The slot-refill engine's phases (rollout/refill.shrink_phases): each phase keeps this
    # fraction of the slots before it.
    "rollout.refill_shrink": {
        "cpu": (0.75, "measured: see benchmarks/RESULTS.md, 'The slot-refill engine leads'"),
        "gpu": (0.5, "fewer compiled copies of the decode step (6 against about 13 at 64 "
                     "slots); not measured"),
        "tpu": (0.5, "as on the GPU (not measured)"),
    },
}


def platform_of(platform: str | None = None) -> str:
  """jax's backend name, "cpu", "gpu" or "tpu" (another backend is treated as "gpu")."""
  if platform is None:
    import jax  # noqa: PLC0415
    platform = jax.default_backend()
  return platform if platform in ("cpu", "tpu") else "gpu"


def choose(setting: str, value: str = "auto", platform: str | None = None) -> str:
  """`value`, or the table's value for `setting` on this platform when value is "auto"."""
  if value != "auto":
    return value
  return PLATFORM_TABLE[setting][platform_of(platform)][0]


def table_lines(platform: str | None = None) -> list:
  """One line per setting: its value on this platform and why (for the docs and the check)."""
  where = platform_of(platform)
  return [f"{setting} = {row[where][0]!r} on {where}: {row[where][1]}"
          for setting, row in PLATFORM_TABLE.items()]
