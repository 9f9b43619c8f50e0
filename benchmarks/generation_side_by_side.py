"""The sampler of two checkouts side by side on this machine: text generation at batch 1 / 8 /
32 / 64 (greedy, 64 new tokens, 32-token prompts, benchmarks/common.py's random Qwen2 shape),
the slot-refill engine against the static one (8 prompts x G = 4, temperature 1, each row's
own limit of 16-128 tokens drawn once, decode_slots = 8), and a tiny random Qwen2.5-VL's
sampler (rollout/vlm_sampler.vlm_sample: 4 prompts with a 32 x 32 image each, G = 4, 64 new
tokens, temperature 1, no EOS). Each checkout runs in its own process (its own grpo_jax),
rounds alternate which goes first, and each figure is the best call of the best round; one
transformers `generate` run (benchmarks/vs_hf_generate.py's) gives the text ratios.

    python benchmarks/generation_side_by_side.py --trees /path/to/base /path/to/new
    python benchmarks/generation_side_by_side.py --trees A B --parts engines --rounds 3 \
        --repeats 7    # refill / static alone, more calls

JSON lines: {"tree", "batch", "ours_tok_s", "hf_tok_s", "ours_over_hf"} per batch,
{"tree", "refill_s", "static_s", "refill_over_static"} and {"tree", "vlm_tok_s"}.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCHES = (1, 8, 32, 64)
NEW = 64


def worker(tree: str, repeats: int, parts: tuple = ("text", "engines", "vlm")) -> dict:
  sys.path.insert(0, tree)
  sys.path.insert(1, HERE)
  import jax
  import numpy as np
  from benchmarks import common
  from grpo_jax.models.hf import load_hf_checkpoint
  from grpo_jax.rollout.sampler import generate
  common.ours_setup()
  cfg, params = load_hf_checkpoint(common.checkpoint("qwen2-4L-256"))
  best = lambda run: min(common.time_it(run, repeats))  # noqa: E731
  out = {"text": {}}
  for batch in BATCHES if "text" in parts else ():
    tokens, mask = common.random_prompts(batch, 32)
    out["text"][batch] = best(lambda: jax.block_until_ready(generate(
        params, tokens, mask, jax.random.key(0), model_cfg=cfg, max_new_tokens=NEW,
        temperature=0.0, eos_id=-1, pad_id=common.PAD_ID)))
  tokens, mask = common.random_prompts(8, 32)
  limits = np.random.RandomState(0).randint(16, 129, 32)
  for engine, slots in (("static", 0), ("refill", 8)) if "engines" in parts else ():
    out[engine] = best(lambda: jax.block_until_ready(generate(
        params, tokens, mask, jax.random.key(1), limits, model_cfg=cfg, max_new_tokens=128,
        temperature=1.0, eos_id=-1, pad_id=common.PAD_ID, group_size=4, decode_slots=slots)))
  if "vlm" in parts:
    out["vlm"] = vlm_seconds(best)
  return out


def vlm_seconds(best) -> float:
  """Seconds of vlm_sample on a tiny random Qwen2.5-VL (the module docstring's call)."""
  import functools

  import jax
  import jax.numpy as jnp
  import numpy as np
  from grpo_jax.models.vision.placeholders import expand_image_placeholders
  from grpo_jax.models.vision.qwen2_5_vl_model import init_vlm_params
  from grpo_jax.models.vision.qwen2_5_vl_model_hf import vlm_config_from_hf
  from grpo_jax.rollout.vlm_sampler import vlm_sample
  text = dict(vocab_size=2000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                   mrope_section=[4, 6, 6]))
  vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=4,
                temporal_patch_size=2, spatial_merge_size=2, window_size=16, out_hidden_size=256,
                fullatt_block_indexes=[1])
  image = 1990
  cfg = vlm_config_from_hf(dict(text_config=text, vision_config=vision, image_token_id=image,
                                tie_word_embeddings=False))
  params = jax.jit(functools.partial(init_vlm_params, cfg))(jax.random.key(0))
  grid = np.array([(1, 8, 8)] * 4, np.int64)
  rng = np.random.RandomState(0)
  rows = [list(rng.randint(3, 1900, 8)) + [image] + list(rng.randint(3, 1900, 12))
          for _ in range(4)]
  ids = np.asarray(expand_image_placeholders(rows, grid, image_token_id=image))
  pixels = rng.randn(int(grid.prod(-1).sum()), 96).astype(np.float32)
  return best(lambda: jax.block_until_ready(vlm_sample(
      params, ids, None, pixels, grid, jax.random.key(2), cfg, NEW, 1.0, 4)))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--trees", nargs="+", required=True)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--parts", nargs="+", default=["text", "engines", "vlm"],
                      help="which figures: text (vs generate), engines (refill / static), vlm")
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print("RESULT " + json.dumps(worker(args.worker, args.repeats, tuple(args.parts))),
          flush=True)
    return
  results = {tree: [] for tree in args.trees}
  for r in range(args.rounds):
    for tree in (args.trees if r % 2 == 0 else args.trees[::-1]):
      done = subprocess.run([sys.executable, __file__, "--trees", tree, "--worker", tree,
                             "--repeats", str(args.repeats), "--parts", *args.parts],
                            capture_output=True, text=True, cwd=tree, check=True)
      line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
      results[tree].append(json.loads(line[7:]))
  if "text" in args.parts:
    print_text(results)
  for tree, runs in results.items():
    if "engines" in args.parts:
      refill, static = (min(run[k] for run in runs) for k in ("refill", "static"))
      print(json.dumps(dict(tree=tree, refill_s=round(refill, 4), static_s=round(static, 4),
                            refill_over_static=round(refill / static, 3))))
    if "vlm" in args.parts:
      vlm = min(run["vlm"] for run in runs)
      print(json.dumps(dict(tree=tree, vlm_tok_s=round(16 * NEW / vlm, 1))))


def print_text(results: dict):
  """One transformers `generate` run, then each tree's ratios to it."""
  hf = subprocess.run([sys.executable, os.path.join(HERE, "benchmarks", "vs_hf_generate.py"),
                       "--side", "hf", "--model", "qwen2-4L-256", "--batches",
                       *map(str, BATCHES), "--new-tokens", str(NEW)],
                      capture_output=True, text=True, cwd=HERE, check=True,
                      env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}).stdout
  hf = json.loads(hf.strip().splitlines()[-1])["results"]
  for tree, runs in results.items():
    for batch in BATCHES:
      ours = min(run["text"][str(batch)] for run in runs)
      theirs = hf[str(batch)]["seconds"]
      print(json.dumps(dict(tree=tree, batch=batch, ours_tok_s=round(batch * NEW / ours, 1),
                            hf_tok_s=round(batch * NEW / theirs, 1),
                            ours_over_hf=round(theirs / ours, 3))))


if __name__ == "__main__":
  main()
