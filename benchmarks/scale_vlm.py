"""Memory, FLOPs and compile time of Qwen2.5-VL's update and prefill at real shape (issue 57,
must-show 4), compiled for this machine's CPU without allocating the model: benchmarks/scale.py
for the vision-language model (grpo_jax/models/vision/qwen2_5_vl_model.py).

Shape (the defaults): Qwen2.5-VL-3B (its config.json, written out in `qwen2_5_vl_3b_config`),
--rows 16 rows, each one image of --image 448 x 448 pixels (grid_thw [1, 32, 32] patches of
14 px: 1024 patches, 256 image tokens after the 2 x 2 merge) + --text 256 text tokens, then
--new 256 completion tokens. Params and compute in --dtype (bfloat16).

What it measures:
  update   jax.value_and_grad of the token-mean log-prob over the completion tokens,
           loss = -sum(logp[b, t] * m[b, t]) / sum(m) over the --new completion tokens only
           (scoring.completion_scores on the decoder, with --remat and --logits-chunk),
           through the whole model on prompt + completion (image + text + new tokens), with
           the vision tower frozen (its params under stop_gradient, grads of the text
           decoder only) or trained (grads of both). No optimizer: the bytes of one
           forward + backward.
  prefill  the sampler's first call: the images encoded, merged into the prompt embeddings,
           and the prompt run through the decoder into its KV cache (rollout/prefill.py)
           into a cache of prompt + new slots; the last position's logits. With --group-size
           G, rows / G prompts (the G samples of a prompt share its prefill).
  sampler  the whole KV-cached sampler (rollout/sampler.py's static engine: images encoded,
           prefill shared G ways, up to --new decode steps, temperature 1): the encoder here,
           then the sampler's jitted body `_sample` on the prompts' inputs. Its decode loop's
           body is counted once by cost_analysis.
  rl_step  what the RL loop compiles with a vision-language policy (benchmarks/scale_vlm_loop.py):
           the learner's jitted RL step (make_rl_step, state donated) with configs/grpo_gsm8k.py's
           rl section (kl_coef 0.001: a reference pass; 4 minibatches x 4 micro-batches, or
           --minibatches / --micro-batches) and AdamW, the Rollout's `images` each row's
           pixel_values; G = --group-size (default 8) rows per prompt.
  sampler_loop  the loop's training rollout: Sampling(...).with_stats(..., images=) ->
           rollout/sampler.py with images on rows / G prompts (G default 8).

How: params are `jax.eval_shape(init_vlm_params, ...)`, every input a `jax.ShapeDtypeStruct`
(the mRoPE positions too: their values never change the program); only the image layout
(patch_layout of grid_thw: window order, segments) is host data, as encode_images needs it.
Then `jax.jit(f).lower(*abstract).compile()` (compile_s: its wall time), memory_analysis()'s
argument / output / alias / temp bytes (GiB = bytes / 2**30; peak = argument + output - alias
+ temp) and cost_analysis()'s flops, with scale.py's field names.

    python benchmarks/scale_vlm.py [--what update_frozen,update_trained,prefill,rl_step,...]
        [--tiny] [--rows 16] [--image 448] [--text 256] [--new 256] [--dtype bfloat16]
        [--group-size G] [--minibatches 4] [--micro-batches 4] [--remat none] [--logits-chunk 0]

  --remat, --logits-chunk  the text decoder's model.remat and model.logits_chunk (the text
           families' fields, on VlmConfig.text): what each layer keeps for the backward pass,
           and how many completion positions are projected onto the vocabulary at a time.

  --tiny   the same programs at a tiny random shape (2 layers, 2 rows, a 112 px image), in
           seconds: the fast test's shape (tests/test_scale_vlm.py).

Output: per measurement a human-readable line, one JSON line (what, shape, rows, image_tokens,
text, new, dtype, compile_s, temp_bytes, argument_bytes, output_bytes, alias_bytes, *_gib,
peak_gib, gflop, while_loops, ...), and at the end a markdown table.

Caveats (scale.py's): XLA:CPU's buffer assignment estimates what a GPU compile needs; the
vision encoder attends per frame / window (qwen2_5_vl.segment_attention), so its score
tensors grow with the sum of each image's patches^2; cost_analysis counts a
scan's body once, so with while_loops > 0 gflop is a lower bound (the decoder's 36 layers and
the encoder's 32 blocks are scans: gflop is about one layer's + one block's + the rest).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks.abstract_values import cost_flops  # noqa: E402
from benchmarks.state_bytes import GIB, tree_gib  # noqa: E402

WHATS = ("update_frozen", "update_trained", "prefill", "sampler", "rl_step", "sampler_loop")
LOOP_WHATS = ("rl_step", "sampler_loop")  # the loop's own programs (scale_vlm_loop.py)
VISION_START, VISION_END = 151652, 151653


def qwen2_5_vl_3b_config() -> dict:
  """Qwen2.5-VL-3B-Instruct's config.json (the released 4.x layout: text fields at the top
  level, rope_scaling.mrope_section), the fields the model reads."""
  return dict(
      model_type="qwen2_5_vl", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
      num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2, hidden_act="silu",
      rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=128000,
      tie_word_embeddings=True, image_token_id=151655, video_token_id=151656,
      vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
      rope_scaling=dict(type="mrope", mrope_section=[16, 24, 24]),
      vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                         in_chans=3, out_hidden_size=2048, patch_size=14, spatial_merge_size=2,
                         temporal_patch_size=2, window_size=112, hidden_act="silu",
                         fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2))


def tiny_config() -> dict:
  """A tiny random Qwen2.5-VL (2 text layers, 2 vision blocks, vocab 512): the same programs
  in seconds."""
  return dict(
      model_type="qwen2_5_vl", vocab_size=512, hidden_size=64, intermediate_size=128,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
      rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
      tie_word_embeddings=True, image_token_id=500,
      rope_scaling=dict(type="mrope", mrope_section=[2, 3, 3]),
      vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                         out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                         temporal_patch_size=2, window_size=112, hidden_act="silu",
                         fullatt_block_indexes=[1]))


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--what", default=",".join(WHATS))
  p.add_argument("--tiny", action="store_true", help="a tiny random model and shape")
  p.add_argument("--rows", type=int, default=None, help="rows (default 16; --tiny 2)")
  p.add_argument("--image", type=int, default=None,
                 help="image side in pixels, a multiple of 28 (default 448; --tiny 112)")
  p.add_argument("--text", type=int, default=None, help="text tokens (default 256; --tiny 8)")
  p.add_argument("--new", type=int, default=None, help="new tokens (default 256; --tiny 8)")
  p.add_argument("--dtype", default="bfloat16", help="params and compute dtype")
  p.add_argument("--group-size", type=int, default=None,
                 help="rows per prompt G (rows / G prompts are prefilled / sampled); default 1 "
                      "for prefill and sampler, 8 for rl_step and sampler_loop (--tiny 2)")
  p.add_argument("--minibatches", type=int, default=None,
                 help="rl_step: rl.num_minibatches (default configs/grpo_gsm8k.py's 4; --tiny 1)")
  p.add_argument("--micro-batches", type=int, default=None,
                 help="rl_step: rl.num_micro_batches (default grpo_gsm8k's 4; --tiny 1)")
  p.add_argument("--remat", default="none",
                 help="model.remat of the text decoder's layers (none, full, save_dots, "
                      "save_dots_no_batch)")
  p.add_argument("--logits-chunk", type=int, default=0,
                 help="model.logits_chunk: completion positions projected at a time (0: all)")
  args = p.parse_args(argv)
  args.what = [w.strip() for w in args.what.split(",") if w.strip()]
  for w in args.what:
    if w not in WHATS:
      p.error(f"--what {w!r}: use {', '.join(WHATS)} (comma-separated)")
  for name, real, tiny in (("rows", 16, 2), ("image", 448, 112), ("text", 256, 8),
                           ("new", 256, 8)):
    if getattr(args, name) is None:
      setattr(args, name, tiny if args.tiny else real)
  if args.image % 28:
    p.error(f"--image {args.image}: use a multiple of 28 (patch 14 x merge 2)")
  if args.text < 2:
    p.error(f"--text {args.text}: use at least 2 (the vision start and end tokens)")
  if args.tiny:
    args.minibatches = args.minibatches or 1
    args.micro_batches = args.micro_batches or 1
  for what in args.what:
    if args.rows % group_size(args, what):
      p.error(f"--rows {args.rows} is not a multiple of --group-size "
              f"{group_size(args, what)} ({what})")
  split = (args.minibatches or 4) * (args.micro_batches or 4)
  if "rl_step" in args.what and args.rows % split:
    p.error(f"--rows {args.rows} does not split into {split} micro-batches (--minibatches x "
            f"--micro-batches); use a multiple of {split}")
  return args


def group_size(args, what: str) -> int:
  """G of a measurement: --group-size, else 1 for prefill / sampler, 8 for the loop's programs
  (--tiny: 2)."""
  if args.group_size:
    return args.group_size
  return (2 if args.tiny else 8) if what in LOOP_WHATS else 1


def vlm_config(args):
  from grpo_jax.models.vision.qwen2_5_vl_model_hf import vlm_config_from_hf
  hf = tiny_config() if args.tiny else qwen2_5_vl_3b_config()
  cfg = vlm_config_from_hf(hf, param_dtype=args.dtype, compute_dtype=args.dtype)
  text = dataclasses.replace(cfg.text, remat=args.remat, logits_chunk=args.logits_chunk)
  return dataclasses.replace(cfg, text=text)


def prompt_layout(cfg, rows: int, image: int, text: int, new: int):
  """Host layout of the batch: (ids (rows, P + new) int32, grid_thw (rows, 3), image tokens per
  row). A row is vision_start, the image's tokens, vision_end, text - 2 text tokens, then the
  new tokens; only where the image tokens sit matters (the values are abstract)."""
  import numpy as np
  patches = image // cfg.vision.patch_size
  grid = np.tile([[1, patches, patches]], (rows, 1))
  image_tokens = patches * patches // cfg.vision.spatial_merge_size ** 2
  row = np.concatenate([[VISION_START % cfg.text.vocab_size],
                        np.full(image_tokens, cfg.image_token_id),
                        [VISION_END % cfg.text.vocab_size], np.full(text - 2 + new, 7)])
  return np.tile(row.astype(np.int32), (rows, 1)), grid, image_tokens


def measure(fn, abstract_args, donate=()) -> dict:
  """Lowers and compiles jit(fn, donate_argnums=donate) on abstract inputs: compile seconds,
  memory_analysis bytes (and GiB, scale.py's names), cost_analysis GFLOP, and the compiled
  module's while loops."""
  import jax
  start = time.perf_counter()
  lowered = jax.jit(fn, donate_argnums=donate).lower(*abstract_args)
  lower_s = time.perf_counter() - start
  compiled = lowered.compile()
  out = dict(compile_s=round(time.perf_counter() - start, 2), lower_s=round(lower_s, 2))
  mem = compiled.memory_analysis()
  get = lambda name: int(getattr(mem, f"{name}_size_in_bytes", 0) or 0)  # noqa: E731
  for name in ("argument", "output", "alias", "temp"):
    out[f"{name}_bytes"] = get(name)
    out[f"{name}_gib"] = round(get(name) / GIB, 4)
  out["peak_gib"] = round((get("argument") + get("output") - get("alias") + get("temp")) / GIB,
                          4)
  out["gflop"] = round(cost_flops(compiled) / 1e9, 2)
  try:
    out["while_loops"] = len(re.findall(r"\bwhile\(", compiled.as_text()))
  except Exception:  # noqa: BLE001  (as_text is best effort)
    out["while_loops"] = None
  return out


def encode(vision_params, pixel_values, grid_thw, cfg):
  """(image tokens, E) of the images: qwen2_5_vl_model.image_features, one encoder call whose
  attention runs per segment (each frame, each window: qwen2_5_vl.segment_attention), so its
  scores grow with each image's patches^2, never the call's total^2."""
  from grpo_jax.models.vision.qwen2_5_vl_model import image_features
  return image_features({"vision": vision_params}, pixel_values, grid_thw, cfg)


def _prompt_inputs(text_params, ids, features, positions, cfg, prompt_len: int):
  """The first prompt_len positions of ids as PromptInputs (models/prompt_inputs.py): the
  image features merged into their embeddings, their mRoPE ids, and the id that follows."""
  from grpo_jax.models.prompt_inputs import PromptInputs
  from grpo_jax.models.vision.qwen2_5_vl_model import merged_embeddings
  x = merged_embeddings(text_params, ids[:, :prompt_len], features, cfg)
  positions = positions[..., :prompt_len]
  return PromptInputs(x, positions, positions[0, :, -1] + 1)


def completion_logprob_loss(text_params, vision_params, ids, kv_mask, pixel_values, positions,
                            completion_mask, *, grid_thw, cfg, freeze_vision: bool, new: int):
  """-sum(logp * m) / sum(m): the token-mean log-prob of the last `new` (completion) tokens, as
  the update scores them (models/scoring.py completion_scores on the decoder, the prompt's
  PromptInputs given: only the completion's positions projected onto the vocabulary, in
  cfg.text.logits_chunk chunks when > 0, the layers rematerialised by cfg.text.remat);
  m = completion_mask over those tokens."""
  import types

  import jax
  import jax.numpy as jnp
  from grpo_jax.models.scoring import completion_scores
  if freeze_vision:
    vision_params = jax.lax.stop_gradient(vision_params)
  features = encode(vision_params, pixel_values, grid_thw, cfg)
  prompt_len = ids.shape[1] - new
  seqs = types.SimpleNamespace(prompt_tokens=ids[:, :prompt_len],
                               prompt_mask=kv_mask[:, :prompt_len],
                               completion_tokens=ids[:, prompt_len:],
                               completion_mask=kv_mask[:, prompt_len:])
  inputs = _prompt_inputs(text_params, ids, features, positions, cfg, prompt_len)
  logp = completion_scores(text_params, cfg.text, seqs, inputs=inputs)[0]
  m = completion_mask[:, -new:].astype(jnp.float32)
  return -jnp.sum(logp * m) / jnp.maximum(jnp.sum(m), 1.0)


def prefill_logits(text_params, vision_params, ids, kv_mask, pixel_values, positions, *,
                   grid_thw, cfg, slots: int):
  """(last logits (B, vocab), cache, kv_mask): images encoded and merged, the prompt written
  into a fresh cache of `slots` slots by the decoder (the engines' prefill,
  rollout/prefill.py)."""
  from grpo_jax.rollout.prefill import prefill
  features = encode(vision_params, pixel_values, grid_thw, cfg)
  inputs = _prompt_inputs(text_params, ids, features, positions, cfg, ids.shape[1])
  return prefill(text_params, ids, kv_mask, model_cfg=cfg.text,
                 max_new_tokens=slots - ids.shape[1], inputs=inputs)


def sampler_tokens(text_params, vision_params, ids, kv_mask, pixel_values, positions,
                   decode_base, key, row_ids, special, *, grid_thw, cfg, new: int, group: int):
  """(tokens, logprobs, mask) of the sampler (rollout/sampler.py, the static engine) on the
  encoded images; decode_base (B / G,): each prompt's first completion id."""
  from grpo_jax.rollout.sampler import Sampling, _sample
  features = encode(vision_params, pixel_values, grid_thw, cfg)
  inputs = _prompt_inputs(text_params, ids, features, positions, cfg, ids.shape[1])
  sampling = Sampling(cfg.text, new, -1, 0, 1.0, group_size=group)
  rollout, _ = _sample(text_params, ids, kv_mask, key, None, row_ids,
                       inputs=inputs._replace(next_position=decode_base), sampling=sampling)
  return rollout.completion_tokens, rollout.logprobs, rollout.completion_mask


def run(args) -> list:
  import functools

  import jax
  import jax.numpy as jnp
  from grpo_jax.models.vision.mrope import mrope_position_ids
  from grpo_jax.models.vision.qwen2_5_vl_model import init_vlm_params

  cfg = vlm_config(args)
  params = jax.eval_shape(lambda k: init_vlm_params(cfg, k), jax.random.key(0))
  sds = jax.ShapeDtypeStruct
  base = dict(shape="tiny" if args.tiny else "qwen2.5-vl-3b", rows=args.rows, image=args.image,
              text=args.text, new=args.new, dtype=args.dtype,
              vision_batch="per_segment", remat=args.remat,
              logits_chunk=args.logits_chunk,
              params_m=round(sum(math.prod(x.shape) for x in jax.tree.leaves(params)) / 1e6, 1),
              vision_params_m=round(sum(math.prod(x.shape)
                                        for x in jax.tree.leaves(params["vision"])) / 1e6, 1),
              params_gib=round(tree_gib(params), 4), backend=jax.default_backend())
  results = []
  for what in args.what:
    group = group_size(args, what)
    rows = args.rows if what in ("update_frozen", "update_trained", "rl_step") else (
        args.rows // group)
    ids, grid, image_tokens = prompt_layout(cfg, rows, args.image, args.text, args.new)
    if what in ("prefill", "sampler", "sampler_loop"):
      ids = ids[:, :-args.new]
    seq = ids.shape[1]
    positions, _ = mrope_position_ids(ids, grid, image_token_id=cfg.image_token_id,
                                      merge_size=cfg.vision.spatial_merge_size)
    patches = int(grid[:, 1:].prod(axis=1).sum())
    inputs = (sds((rows, seq), jnp.int32), sds((rows, seq), jnp.bool_),
              sds((patches, cfg.vision.patch_dim), jnp.float32),
              sds(positions.shape, jnp.int32))
    extra = dict(group_size=group)
    if what in LOOP_WHATS:
      from benchmarks import scale_vlm_loop as loop
      loop_cfg, prompt_len = loop.loop_config(cfg, args.image), image_tokens + args.text
      if what == "rl_step":
        fn, abstract, facts = loop.rl_step_program(
            loop_cfg, params, rows=rows, prompt_len=prompt_len, new=args.new, group=group,
            minibatches=args.minibatches, micro_batches=args.micro_batches)
        m = measure(fn, abstract, donate=0)  # the state donated, as the learner jits it
      else:
        fn, abstract, facts = loop.sampler_loop_program(
            loop_cfg, params, prompts=rows, prompt_len=prompt_len, new=args.new, group=group)
        m = measure(fn, abstract)
      extra.update(facts)
    elif what == "prefill":
      fn = functools.partial(prefill_logits, grid_thw=grid, cfg=cfg, slots=seq + args.new)
      m = measure(fn, (params["text"], params["vision"], *inputs))
    elif what == "sampler":
      fn = functools.partial(sampler_tokens, grid_thw=grid, cfg=cfg, new=args.new,
                             group=group)
      m = measure(fn, (params["text"], params["vision"], *inputs, sds((rows,), jnp.int32),
                       jax.eval_shape(lambda: jax.random.key(0)),
                       sds((args.rows,), jnp.int32), sds((2,), jnp.int32)))
    else:
      freeze = what == "update_frozen"
      loss = functools.partial(completion_logprob_loss, grid_thw=grid, cfg=cfg,
                               freeze_vision=freeze, new=args.new)
      fn = jax.value_and_grad(loss, argnums=0 if freeze else (0, 1))
      m = measure(fn, (params["text"], params["vision"], *inputs,
                       sds((rows, seq), jnp.bool_)))
    result = dict(what=what, **base, batch_rows=rows, image_tokens=image_tokens,
                  patches=patches, seq=seq, **extra, **m)
    results.append(result)
    print(f"{what} {result['shape']} rows={rows} image={args.image}px ({image_tokens} tokens) "
          f"text={args.text} new={args.new} {args.dtype} vision={result['vision_batch']}: "
          f"compile {m['compile_s']:.1f} s, "
          f"args {m['argument_gib']} GiB, out {m['output_gib']} GiB, temp {m['temp_gib']} GiB, "
          f"{m['gflop']} GFLOP", flush=True)
    print(json.dumps(result), flush=True)
  print(markdown_table(results), flush=True)
  return results


def markdown_table(results) -> str:
  """The results as a markdown table (one row per measurement)."""
  lines = ["| what | vision batch | remat | logits chunk | rows | seq | compile s "
           "| argument GiB | output GiB | temp GiB | peak GiB | GFLOP (loops counted once) |",
           "|---" * 12 + "|"]
  for r in results:
    lines.append(f"| {r['what']} | {r['vision_batch']} | {r['remat']} | {r['logits_chunk']} | "
                 f"{r['batch_rows']} | {r['seq']} | {r['compile_s']} | "
                 f"{r['argument_gib']} | {r['output_gib']} | {r['temp_gib']} | "
                 f"{r['peak_gib']} | {r['gflop']} |")
  return "\n".join(lines)


def main(argv=None):
  return run(parse_args(argv))


if __name__ == "__main__":
  main()
