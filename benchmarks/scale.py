"""Memory, FLOPs and compile time of the RL step and the sampler at real model shapes, measured
by compiling for this machine's CPU without allocating the model.

What it measures, for each `--what`:
  update   the whole RL step, `grpo_jax.train.learner.step.make_rl_step(StepSpec(...))`, jitted with
           the state donated (donate_argnums=0) as the host loop does: preparation (reference
           log-probs: GRPO with KL in the loss, beta = 0.001), advantages, and the update with
           rl.num_micro_batches = --micro-batches; AdamW with the GSM8K recipe's optim section
           (configs/grpo_gsm8k.py). rl is `rl_defaults(num_micro_batches=K, kl_coef=--kl-coef,
           num_minibatches=--minibatches, shared_prompt_forward=--shared-prompt-forward)`
           (one minibatch, so the old log-probs are the update's own: no extra forward pass).
           --shared-prompt-forward: each prompt runs once for its G completions in the
           reference and update passes (rl.shared_prompt_forward).
  sampler  `grpo_jax.rollout.sampler.generate` (prefill + the decode while_loops), temperature
           1, on rows / G prompts with G samples each (prefix sharing), decode segments of
           --decode-block steps.
  prefill  `grpo_jax.rollout.prefill.prefill` of rows / G prompts, each computed once and its
           cache rows repeated G times (--no-prefix-sharing: rows prompts, group size 1).
  state    no compile: the train state's bytes (per device with --mesh) for full fine-tuning
           (params, AdamW moments, reference, all float32) and for LoRA of rank --lora-rank
           (default 16) on every projection (adapters and their moments float32, the frozen
           base in --base-dtype, no reference copy), and their ratio.
With --lora-rank R > 0, `update` and `sampler` run under LoRA (adapters of rank R, the base in
--base-dtype).

How: params are `jax.eval_shape(init_params, ...)` (fp32 master weights, bf16 compute, as in
configs/grpo_gsm8k.py), the train state `jax.eval_shape(initial_state, ...)`, the rollout and
rewards `jax.ShapeDtypeStruct`s; then `jax.jit(f, donate_argnums=...).lower(*abstract)
.compile()` (its wall time is `compile_s`), and `compiled.memory_analysis()` (temp, argument,
output and alias bytes; GiB = bytes / 2**30) and `compiled.cost_analysis()["flops"]`. Nothing
of model size is ever allocated, so a 7B shape "runs" on a laptop (compile time permitting).

    python benchmarks/scale.py --shape qwen2.5-0.5b --rows 16 --prompt 256 --new 256 \\
        [--micro-batches K] [--layers L] [--group-size G] [--what update,sampler,prefill] \\
        [--remat none|full|save_dots|...] [--logits-chunk C] [--mesh D,F,T[,E]] \\
        [--decode-block S] [--no-prefix-sharing]

  --shape        qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-7b | smollm2-135m (their HF configs),
                 or one of the small random checkpoints of benchmarks/common.py (qwen2-4L-256, ...)
  --layers L     override the shape's layer count (compile time grows with it; per-layer
                 costs are linear, so a few layers extrapolate)
  --rows         completion rows B = prompts x G (a multiple of G and of K)
  --group-size   G (default min(rows, 4))
  --remat, --logits-chunk, --context-layout   set on the ModelConfig when this version of it
                 has the fields; otherwise a warning on stderr and ignored
  --mesh D,F,T[,E[,C]] (data, fsdp, tensor, expert, context) over D*F*T*E*C fake CPU devices
                 (this script sets XLA_FLAGS=--xla_force_host_platform_device_count before
                 importing jax); inputs get the mesh rules' shardings and the programs are
                 traced under `jax.set_mesh` as the training loop does (the decoder's activation
                 constraints apply: context C splits each row's tokens); the memory numbers are
                 then per device, and `state_gib_per_device` is the most loaded device's share
                 of the state

Output: per measurement a human-readable line, then one JSON line with what, shape, layers,
rows, prompt, new, micro_batches, group_size, remat, logits_chunk, compile_s, temp_gib,
argument_gib, output_gib, alias_gib, peak_gib (argument + output - alias + temp), gflop, ...

Caveats:
  * memory_analysis() is XLA:CPU's buffer assignment: an estimate of what a GPU/TPU compile of
    the same program needs, not identical (other fusions, layouts, collective buffers; XLA:CPU
    may up-cast some bf16 work to f32; GPU adds allocator fragmentation and workspace).
  * cost_analysis() counts a while loop's body once (XLA does not know the trip count), so the
    sampler's gflop is prefill + ONE decode step, not N of them; the update's micro-batch scan
    and minibatch scan are likewise counted once per body (the step's FLOPs at K > 1 are
    ~K x the scanned part), and with --logits-chunk the vocabulary projection runs in a
    lax.map whose body (one chunk) is counted once. The JSON's `while_loops` counts the while
    loops of the compiled module: when it is > 0, gflop is a lower bound.
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
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks.shapes import shape_table  # noqa: E402
from benchmarks.abstract_values import concrete, cost_flops, with_shardings  # noqa: E402,F401
from benchmarks.state_bytes import (GIB, abstract_state, measure_state,  # noqa: E402
                                    optim_section, per_device_gib, tree_gib)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shape", default="qwen2.5-0.5b")
  p.add_argument("--rows", type=int, default=16)
  p.add_argument("--prompt", type=int, default=256)
  p.add_argument("--new", type=int, default=256)
  p.add_argument("--micro-batches", type=int, default=1)
  p.add_argument("--minibatches", type=int, default=1,
                 help="rl.num_minibatches (the GSM8K recipe: 4); rows = all minibatches")
  p.add_argument("--layers", type=int, default=None)
  p.add_argument("--group-size", type=int, default=None)
  p.add_argument("--what", default="update")
  p.add_argument("--remat", default=None, help="none | full | save_dots | ... (if supported)")
  p.add_argument("--logits-chunk", type=int, default=None)
  p.add_argument("--time", type=int, default=0,
                 help="also run each compiled call this many times on dummy values (allocates "
                      "the model) and print its seconds")
  p.add_argument("--compute-dtype", default="bfloat16",
                 help="model.compute_dtype (the GSM8K recipe's bfloat16; float32 on this CPU)")
  p.add_argument("--scan-layers", action="store_true",
                 help="layers as one nn.scan over stacked params (model.scan_layers of "
                      "versions that had both layouts; always on since)")
  p.add_argument("--mesh", default=None,
                 help="D,F,T[,E[,C]]: (data, fsdp, tensor, expert, context) fake CPU devices")
  p.add_argument("--context-layout", default=None, help="model.context_layout (contiguous | "
                 "zigzag; default: this platform's)")
  p.add_argument("--kl-coef", type=float, default=0.001,
                 help="update: rl.kl_coef (0: no reference is kept or run)")
  p.add_argument("--decode-loop", default="auto",
                 help="sampler: rollout.decode_loop (segments | bounded; auto: this platform's)")
  p.add_argument("--decode-slots", type=int, default=0,
                 help="sampler: rollout.decode_slots (the slot-refill engine; 0: static)")
  p.add_argument("--split-attention", action="store_true",
                 help="update: the context path's attention (query blocks recomputed in the "
                      "backward pass) without a context axis, to compare with context > 1")
  p.add_argument("--decode-block", type=int, default=128,
                 help="sampler: decode steps per segment (rollout.decode_block; 0 = one)")
  p.add_argument("--lora-rank", type=int, default=0,
                 help="LoRA rank (all-linear) for update/sampler; state: default 16")
  p.add_argument("--base-dtype", default="float32", help="LoRA's frozen base: float32|bfloat16")
  p.add_argument("--shared-prompt-forward", action="store_true",
                 help="update: each prompt runs once for its G rows (rl.shared_prompt_forward)")
  p.add_argument("--no-prefix-sharing", action="store_true",
                 help="sampler/prefill: feed every prompt G times (the sampler before #13)")
  args = p.parse_args(argv)
  args.what = [w.strip() for w in args.what.split(",") if w.strip()]
  for w in args.what:
    if w not in ("update", "sampler", "prefill", "state"):
      p.error(f"--what {w!r}: use update, sampler, prefill or state (comma-separated)")
  if args.group_size is None:
    args.group_size = min(args.rows, 4)
  if args.rows % args.group_size:
    p.error(f"--rows {args.rows} is not a multiple of --group-size {args.group_size}")
  if (args.shared_prompt_forward and "update" in args.what
      and (args.rows // (args.micro_batches * args.minibatches)) % args.group_size):
    p.error(f"--shared-prompt-forward: a micro-batch of --rows / (--minibatches x "
            f"--micro-batches) rows must hold whole groups of --group-size {args.group_size}")
  if "update" in args.what and args.rows % (args.micro_batches * args.minibatches):
    p.error(f"--rows {args.rows} is not a multiple of --minibatches x --micro-batches "
            f"({args.minibatches} x {args.micro_batches})")
  if args.mesh is not None:
    try:
      args.mesh = tuple(int(x) for x in args.mesh.split(","))
      assert len(args.mesh) in (3, 4, 5) and all(x > 0 for x in args.mesh)
    except (ValueError, AssertionError):
      p.error(f"--mesh {args.mesh!r}: use three to five positive sizes D,F,T[,E[,C]]")
  return args


def model_config(args):
  from grpo_jax.models.config import ModelConfig
  table = shape_table()
  if args.shape not in table:
    sys.exit(f"--shape {args.shape!r} is unknown; known: {', '.join(table)}")
  kw = dict(table[args.shape])
  if args.layers is not None:
    kw["num_layers"] = args.layers
  cfg = ModelConfig(**kw, param_dtype="float32", compute_dtype=args.compute_dtype)
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  for option, field, value in (("--remat", "remat", args.remat),
                               ("--logits-chunk", "logits_chunk", args.logits_chunk),
                               ("--context-layout", "context_layout", args.context_layout),
                               ("--scan-layers", "scan_layers", args.scan_layers or None)):
    if value is None:
      continue
    if field in fields:
      cfg = dataclasses.replace(cfg, **{field: value})
    elif field != "scan_layers":  # (one stacked layout: scanned always)
      print(f"warning: {option} is not supported by this version of grpo_jax "
            f"(ModelConfig has no field {field!r}); ignored", file=sys.stderr)
  return cfg


def measure(fn, abstract_args, donate=(), jit_kwargs=None, time_calls=0) -> dict:
  """Lowers and compiles jit(fn) on abstract inputs; compile time, memory and FLOPs. With
  time_calls > 0 it also runs the compiled call that many times on `concrete` inputs (a
  donated first argument replaced by the first output) and reports each call's seconds."""
  import jax
  start = time.perf_counter()
  lowered = jax.jit(fn, donate_argnums=donate, **(jit_kwargs or {})).lower(*abstract_args)
  lower_s = time.perf_counter() - start
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  mem = compiled.memory_analysis()
  out = dict(compile_s=round(compile_s, 2), lower_s=round(lower_s, 2))
  if mem is None:  # some backends / versions give none
    out.update(temp_gib=None, argument_gib=None, output_gib=None, alias_gib=None, peak_gib=None)
  else:
    get = lambda name: int(getattr(mem, name, 0) or 0)  # noqa: E731
    temp, arg = get("temp_size_in_bytes"), get("argument_size_in_bytes")
    outb, alias = get("output_size_in_bytes"), get("alias_size_in_bytes")
    out.update(temp_gib=round(temp / GIB, 4), argument_gib=round(arg / GIB, 4),
               output_gib=round(outb / GIB, 4), alias_gib=round(alias / GIB, 4),
               peak_gib=round((arg + outb - alias + temp) / GIB, 4))
  out["gflop"] = round(cost_flops(compiled) / 1e9, 2)
  if time_calls:
    args, seconds = concrete(abstract_args), []
    for _ in range(time_calls):
      start = time.perf_counter()
      result = jax.block_until_ready(compiled(*args))
      seconds.append(round(time.perf_counter() - start, 2))
      if donate == 0:
        args = (result[0],) + tuple(args[1:])
    out["call_s"] = seconds
  # XLA's cost analysis counts each while loop's body once: with loops, gflop is a lower bound.
  try:
    out["while_loops"] = len(re.findall(r"\bwhile\(", compiled.as_text()))
  except Exception:  # noqa: BLE001  (as_text is best effort on some backends)
    out["while_loops"] = None
  return out


def run(args) -> list:
  import contextlib

  import jax
  import jax.numpy as jnp

  from grpo_jax.models.decoder import init_params

  cfg = model_config(args)
  if args.lora_rank:
    from grpo_jax.models.lora import lora_scale
    cfg = dataclasses.replace(cfg, lora_scale=lora_scale(args.lora_rank, 2 * args.lora_rank))
  rows, plen, new = args.rows, args.prompt, args.new
  key = jax.random.key(0)
  params = jax.eval_shape(lambda k: init_params(cfg, k), key)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))

  mesh = None
  if args.mesh is not None:
    from grpo_jax.parallel.mesh import batch_axis_size, make_mesh, mesh_config
    mesh = make_mesh(mesh_config(*args.mesh))
    batch_rows = batch_axis_size(mesh)
    if rows % batch_rows:
      sys.exit(f"--rows {rows} does not split over data x fsdp x expert = {batch_rows} "
               f"devices")

  sds = jax.ShapeDtypeStruct
  group = 1 if args.no_prefix_sharing else args.group_size  # the sampler's rows per prompt
  prompts = (sds((rows, plen), jnp.int32), sds((rows, plen), jnp.bool_))
  sampler_prompts = (sds((rows // group, plen), jnp.int32), sds((rows // group, plen), jnp.bool_))
  base = dict(shape=args.shape, layers=cfg.num_layers, rows=rows, prompt=plen, new=new,
              micro_batches=args.micro_batches, minibatches=args.minibatches,
              group_size=args.group_size,
              prompts=rows // args.group_size, remat=getattr(cfg, "remat", None),
              logits_chunk=getattr(cfg, "logits_chunk", None),
              scan_layers=getattr(cfg, "scan_layers", True),
              params_m=round(n_params / 1e6, 1), params_gib=round(tree_gib(params), 4),
              mesh=None if mesh is None else list(args.mesh), backend=jax.default_backend())
  if args.split_attention:  # the decoder takes its context-parallel attention path
    from grpo_jax.models import decoder
    decoder.context_size = lambda: 2
  results = []
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    for what in args.what:
      results.append(measure_one(args, what, cfg, params, key, mesh, base, prompts,
                                 sampler_prompts, group))
  return results


def measure_one(args, what, cfg, params, key, mesh, base, prompts, sampler_prompts, group):
  """One --what's measurement (see the module docstring)."""
  import jax
  import jax.numpy as jnp

  from benchmarks import common
  from grpo_jax.defaults import rl_defaults
  from grpo_jax.rollout import prefill as prefill_lib, sampler
  from grpo_jax.train.learner.experience import RewardInputs
  from grpo_jax.train.learner.state import make_optimizer
  from grpo_jax.train.learner.step import StepSpec, make_rl_step
  from grpo_jax.train.stages.rl import initial_state
  sds = jax.ShapeDtypeStruct
  rows, plen, new = args.rows, args.prompt, args.new
  batch_rows = rows_sharded = None
  if mesh is not None:
    from benchmarks.state_bytes import tree_shardings
    from grpo_jax.parallel.mesh import batch_axis_size, batch_sharding
    batch_rows = batch_axis_size(mesh)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows_sharded = lambda tree: with_shardings(tree, jax.tree.map(  # noqa: E731
        lambda x: batch_sharding(mesh, len(x.shape)) if x.shape else replicated, tree))
  extra = {}
  if what == "state":
    return measure_state(args, cfg, params, key, mesh, base)
  if what == "update":
    rl = rl_defaults(num_micro_batches=args.micro_batches, kl_coef=args.kl_coef,
                     num_minibatches=args.minibatches,
                     shared_prompt_forward=args.shared_prompt_forward)
    optimizer = make_optimizer(optim_section(), 100)
    if args.lora_rank:
      state = abstract_state(cfg, params, optimizer, key, args.lora_rank, args.base_dtype)
    else:
      state = jax.eval_shape(lambda p, k: initial_state(rl, cfg, p, optimizer, k),
                             params, key)
    rollout = sampler.Rollout(
        prompts[0], prompts[1], sds((rows, new), jnp.int32), sds((rows, new), jnp.bool_),
        sds((rows, new), jnp.float32), sds((rows,), jnp.bool_), sds((rows, new), jnp.bool_))
    inputs = RewardInputs(sds((rows,), jnp.float32), {}, sds((), jnp.int32))
    step = make_rl_step(StepSpec(cfg, rl, optimizer, args.group_size, temperature=1.0,
                                 max_new_tokens=new))
    extra["state_gib"] = round(tree_gib(state), 4)
    jit_kwargs = {}
    if mesh is not None:
      state_shardings = tree_shardings(state, mesh)  # as the loop
      extra["state_gib_per_device"] = round(per_device_gib(state, state_shardings), 4)
      state = with_shardings(state, state_shardings)
      rollout, inputs = rows_sharded(rollout), rows_sharded(inputs)
      jit_kwargs["out_shardings"] = (state_shardings, None)  # as train/stages/rl.py
    m = measure(step, (state, rollout, inputs), donate=0, jit_kwargs=jit_kwargs,
                time_calls=args.time)
  else:
    p_abs, (tok, msk) = params, sampler_prompts
    if args.lora_rank:  # the sampler's policy under LoRA: base + adapters, never merged
      from grpo_jax.train.learner.state import policy_params
      p_abs = policy_params(abstract_state(cfg, params, make_optimizer(optim_section(), 1),
                                           key, args.lora_rank, args.base_dtype))
    extra.update(sampler_prompts=rows // group, sampler_group=group,
                 decode_block=args.decode_block, decode_slots=args.decode_slots,
                 decode_loop=args.decode_loop)
    if mesh is not None:
      shardings = tree_shardings(p_abs, mesh)
      extra["params_gib_per_device"] = round(per_device_gib(p_abs, shardings), 4)
      p_abs = with_shardings(p_abs, shardings)
      if (rows // group) % batch_rows == 0:  # else replicated, as the loop places them
        tok, msk = rows_sharded((tok, msk))
    if what == "sampler":
      k_abs = jax.eval_shape(lambda: key)
      fn = lambda p, t, m, k: sampler.generate(  # noqa: E731
          p, t, m, k, model_cfg=cfg, max_new_tokens=new, temperature=1.0,
          eos_id=common.EOS_ID, pad_id=common.PAD_ID, mesh=mesh, group_size=group,
          decode_block=args.decode_block, decode_slots=args.decode_slots,
          decode_loop=args.decode_loop)
      m = measure(fn, (p_abs, tok, msk, k_abs))
    else:
      fn = lambda p, t, m: prefill_lib.prefill(  # noqa: E731
          p, t, m, model_cfg=cfg, max_new_tokens=new, mesh=mesh, group_size=group)
      m = measure(fn, (p_abs, tok, msk))
  result = dict(what=what, **base, **m, **extra)
  human = (f"{what} {args.shape} L={cfg.num_layers} rows={rows} (G={args.group_size}) "
           f"P={plen} N={new} K={args.micro_batches} remat={result['remat']} "
           f"chunk={result['logits_chunk']}"
           f"{'' if mesh is None else ' mesh=' + 'x'.join(map(str, args.mesh))}: "
           f"compile {m['compile_s']:.1f} s, temp {m['temp_gib']} GiB, args "
           f"{m['argument_gib']} GiB, out {m['output_gib']} GiB, alias {m['alias_gib']} GiB, "
           f"{m['gflop']} GFLOP" + (f", calls {m['call_s']} s" if "call_s" in m else ""))
  print(human, flush=True)
  print(json.dumps(result), flush=True)
  return result


def main(argv=None):
  args = parse_args(argv)
  if args.mesh is not None:  # before jax is imported anywhere
    if "jax" in sys.modules:
      sys.exit("--mesh needs XLA_FLAGS set before jax is imported; run this file as a script")
    n = math.prod(args.mesh)
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  run(args)


if __name__ == "__main__":
  main()
