"""The accelerator check's four parts (env, sampler, update, gsm8k; what each measures and the
MFU formula: benchmarks/accelerator_check.py's docstring). benchmarks/accelerator_check.py runs
each in its own child process (`--part NAME`), which calls the part_* function here; each emits
its results as CHECK lines of JSON on stdout."""

from __future__ import annotations

import json
import os
import platform as host_platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def emit(record: dict) -> None:
  print("CHECK " + json.dumps(record), flush=True)


def model_cfg(sizes: dict, tiny: bool):
  from grpo_jax.models.config import ModelConfig
  if tiny:
    kw = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=16, tie_embeddings=True, qkv_bias=True)
  else:
    from benchmarks.shapes import shape_table
    kw = dict(shape_table()[sizes["shape"]])
  return ModelConfig(**kw, param_dtype="float32",
                     compute_dtype="float32" if tiny else "bfloat16")


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def part_env(sizes: dict, tiny: bool) -> None:
  import importlib.metadata as md
  import jax
  import jax.numpy as jnp
  from grpo_jax.parallel.choices import table_lines
  devices = jax.devices()
  plugins = {}
  for name in ("jax-cuda13-plugin", "jax-cuda12-plugin", "jax-cuda13-pjrt", "libtpu"):
    try:
      plugins[name] = md.version(name)
    except md.PackageNotFoundError:
      pass
  n = sizes["matmul"]
  dtype = jnp.float32 if tiny else jnp.bfloat16
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  matmul = jax.jit(lambda x: x @ x)
  jax.block_until_ready(matmul(a))
  _, seconds = timed(lambda: jax.block_until_ready([matmul(a) for _ in range(10)]))
  tflops = 10 * 2 * n ** 3 / seconds / 1e12
  x = jnp.ones((sizes["copy_mib"] * 2 ** 20 // 4,), jnp.float32)
  bump = jax.jit(lambda y: y + 1.0)
  jax.block_until_ready(bump(x))
  _, seconds = timed(lambda: jax.block_until_ready([bump(x) for _ in range(10)]))
  emit(dict(part="env", jax=jax.__version__, jaxlib=md.version("jaxlib"), plugins=plugins,
            backend=jax.default_backend(), device_kind=devices[0].device_kind,
            device_count=len(devices), host=host_platform.node(),
            xla_flags=os.environ.get("XLA_FLAGS", ""), choices=table_lines(),
            matmul_dtype=str(jnp.dtype(dtype)), matmul_tflops=round(tflops, 4),
            memory_gbps=round(10 * 2 * x.nbytes / seconds / 1e9, 1)))


def part_sampler(sizes: dict, tiny: bool, memory_gbps: float) -> None:
  import jax
  import numpy as np
  from grpo_jax import compile_log
  from grpo_jax.models.decoder import init_params
  from grpo_jax.parallel.choices import choose
  from grpo_jax.rollout.prefill import prefill
  from grpo_jax.rollout.sampler import Sampling, _sample
  compile_log.install()
  cfg = model_cfg(sizes, tiny)
  params = jax.jit(lambda k: init_params(cfg, k))(jax.random.key(0))
  plen, new, group = sizes["prompt"], sizes["new"], sizes["group"]
  matrices = sum(x.size for x in jax.tree.leaves(params) if x.ndim >= 2)
  kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * cfg.dtype.itemsize
  auto = choose("rollout.decode_loop")
  middle = sizes["batches"][len(sizes["batches"]) // 2]
  other = "segments" if auto == "bounded" else "bounded"
  # The platform's own loop at every batch first; the other one last (at the middle batch),
  # so that a slow compile of it cannot cost the others' figures.
  runs = [(rows, [auto]) for rows in sizes["batches"]] + [(middle, [other])]
  for rows, loops in runs:
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size, (rows // group, plen), dtype=np.int32)
    mask = np.ones_like(tokens, bool)
    fill = jax.jit(lambda p, t, m: prefill(p, t, m, model_cfg=cfg, max_new_tokens=new,
                                           group_size=group, shared_prompt=group > 1,
                                           cache_slots=plen + new))
    jax.block_until_ready(fill(params, tokens, mask))
    prefill_s = min(timed(lambda: jax.block_until_ready(fill(params, tokens, mask)))[1]
                    for _ in range(2))
    for loop in loops:
      sampling = Sampling(cfg, new, -1, 0, temperature=1.0, group_size=group,
                          decode_block=128, decode_loop=loop)
      args = (params, tokens, mask, jax.random.key(1), None)
      compile_log.reset()
      traced, trace_s = timed(lambda: _sample.trace(*args, sampling=sampling))
      lowered, lower_s = timed(traced.lower)
      compiled, compile_s = timed(lowered.compile)
      _, first_s = timed(lambda: jax.block_until_ready(compiled(*args)))
      steady_s = min(timed(lambda: jax.block_until_ready(compiled(*args)))[1] for _ in range(2))
      decode_s = max(steady_s - prefill_s, 1e-9)
      per_step = 2 * matrices + kv_per_token * (rows // group * plen + rows * new / 2)
      bound = rows / (per_step / (memory_gbps * 1e9)) if memory_gbps else None
      tokens_per_s = rows * new / decode_s
      emit(dict(part="sampler", rows=rows, group=group, prompt=plen, new=new,
                decode_loop=loop, decode_block=128, trace_s=round(trace_s, 2),
                lower_s=round(lower_s, 2), compile_s=round(compile_s, 2),
                first_call_s=round(first_s, 3),
                first_call_total_s=round(trace_s + lower_s + compile_s + first_s, 2),
                steady_s=round(steady_s, 4), prefill_s=round(prefill_s, 4),
                decode_tokens_per_s=round(tokens_per_s, 1),
                bound_tokens_per_s=None if bound is None else round(bound, 1),
                fraction_of_bound=None if bound is None else round(tokens_per_s / bound, 4),
                programs=sum(r["programs"] for r in compile_log.table().values())))


def model_flops(cfg, rows: int, group: int, plen: int, new: int) -> float:
  """benchmarks/accelerator_check.py's formula: 4 x F_fwd of one RL step with the shared-prompt
  forward."""
  h, q, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  per_layer = h * d * (q + 2 * kv) + q * d * h + 3 * h * cfg.intermediate_size
  prompts = rows // group
  tokens = prompts * plen + rows * new
  pairs = prompts * plen * (plen + 1) / 2 + rows * (new * plen + new * (new + 1) / 2)
  forward = (2 * per_layer * cfg.num_layers * tokens + 2 * cfg.vocab_size * h * rows * new
             + 4 * cfg.num_layers * q * d * pairs)
  return 4 * forward


def part_update(sizes: dict, tiny: bool, peak_tflops: float) -> None:
  """The RL step with the platform's attention, then with the alternative the table would
  switch to (cuDNN's fused attention on a GPU; jax.nn's XLA form elsewhere): one line each."""
  import contextlib
  import dataclasses
  import io

  import jax
  from benchmarks import scale
  from grpo_jax import compile_log
  from grpo_jax.parallel.choices import choose
  compile_log.install()
  timings = {}

  def measure(fn, abstract_args, donate=(), jit_kwargs=None, time_calls=0):
    jitted = jax.jit(fn, donate_argnums=donate, **(jit_kwargs or {}))
    traced, timings["trace_s"] = timed(lambda: jitted.trace(*abstract_args))
    lowered, timings["lower_s"] = timed(traced.lower)
    compiled, timings["compile_s"] = timed(lowered.compile)
    args, calls = scale.concrete(abstract_args), []
    for _ in range(time_calls):
      result, seconds = timed(lambda: jax.block_until_ready(compiled(*args)))
      calls.append(round(seconds, 4))
      args = (result[0],) + tuple(args[1:])
    return dict(compile_s=timings["compile_s"], lower_s=timings["lower_s"], call_s=calls,
                temp_gib=None, argument_gib=None, output_gib=None, alias_gib=None, gflop=None)

  scale.measure = measure
  rows, group = sizes["update_rows"], sizes["group"]
  argv = ["--rows", str(rows), "--group-size", str(group), "--prompt", str(sizes["prompt"]),
          "--new", str(sizes["new"]), "--micro-batches", str(sizes["micro_batches"]),
          "--what", "update", "--shared-prompt-forward", "--time", "3"]
  auto = choose("model.attention_impl")
  alternative = "cudnn" if jax.default_backend() == "gpu" else "jax"
  for impl in [auto] + ([alternative] if alternative != auto else []):
    cfg = dataclasses.replace(model_cfg(sizes, tiny), remat="full", logits_chunk=64,
                              attention_impl=impl)
    scale.model_config = lambda args, cfg=cfg: cfg
    compile_log.reset()
    with contextlib.redirect_stdout(io.StringIO()):
      result = scale.run(scale.parse_args(argv))[0]
    steady = min(result["call_s"][1:] or result["call_s"])
    flops = model_flops(cfg, rows, group, sizes["prompt"], sizes["new"])
    emit(dict(part="update", attention_impl=impl, rows=rows, group=group,
              prompt=sizes["prompt"], new=sizes["new"], micro_batches=sizes["micro_batches"],
              trace_s=round(timings["trace_s"], 2), lower_s=round(timings["lower_s"], 2),
              compile_s=round(timings["compile_s"], 2), call_s=result["call_s"],
              steady_s=steady,
              tokens_per_s=round(rows * (sizes["prompt"] + sizes["new"]) / steady, 1),
              model_tflop=round(flops / 1e12, 3),
              mfu=round(flops / steady / (peak_tflops * 1e12), 4) if peak_tflops else None,
              programs=sum(r["programs"] for r in compile_log.table().values())))


def write_checkpoint(directory: str, sizes: dict, tiny: bool) -> str:
  """A random Qwen2 checkpoint with the tests' small BPE tokenizer (GSM8K-trained, ChatML)."""
  if os.path.isfile(os.path.join(directory, "config.json")):
    return directory
  from tests.hf_fixtures import save_tiny_qwen2, save_tiny_tokenizer
  if tiny:
    return save_tiny_qwen2(directory)
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM
  from benchmarks.common import SHAPES
  tokenizer = save_tiny_tokenizer(directory)
  torch.manual_seed(0)
  config = Qwen2Config(**SHAPES[sizes["shape"]], max_position_embeddings=4096,
                       tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
  Qwen2ForCausalLM(config).float().save_pretrained(directory)
  return directory


def part_gsm8k(sizes: dict, tiny: bool, limit: float, workdir: str) -> None:
  from benchmarks.compile_times import parse
  checkpoint = write_checkpoint(os.path.join(workdir, "checkpoint"), sizes, tiny)
  run_dir = tempfile.mkdtemp(dir=workdir, prefix="run-")
  data = os.path.join(ROOT, "tests", "data", "gsm8k")
  small = (["--config.rollout.num_prompts=2", "--config.rollout.group_size=2",
            "--config.rollout.max_new_tokens=12", "--config.data.max_prompt_tokens=200",
            "--config.rl.num_minibatches=2", "--config.rl.num_micro_batches=1",
            "--config.train.eval_size=2", "--config.train.eval_batch_size=2"] if tiny else
           ["--config.train.eval_size=64", "--config.train.eval_batch_size=64",
            f"--config.rollout.num_prompts={sizes['gsm8k_prompts']}"])
  command = [sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_gsm8k.py",
             f"--workdir={run_dir}", f"--config.model.path={checkpoint}",
             f"--config.data.path={data}", "--config.train.steps=2",
             "--config.train.eval_every=1000", "--config.train.checkpoint_every=1000",
             "--config.train.export=False", *small]
  env = dict(os.environ, JAX_LOG_COMPILES="1")
  start = time.perf_counter()
  try:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=max(limit - 20, 10))
    log, code = done.stdout + done.stderr, done.returncode
  except subprocess.TimeoutExpired as e:
    log = (e.stdout or b"").decode() + (e.stderr or b"").decode() if isinstance(
        e.stdout, bytes) else (e.stdout or "") + (e.stderr or "")
    code = "timeout"
  wall = time.perf_counter() - start
  steps = {}
  path = os.path.join(run_dir, "metrics.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      for r in map(json.loads, f):
        if "time_update_s" in r:
          steps[r["step"]] = {k: round(r[f"time_{k}_s"], 3) for k in
                              ("rollout", "reward", "update") if f"time_{k}_s" in r}
  programs = parse(log)
  emit(dict(part="gsm8k", exit=code, wall_s=round(wall, 1), first_step=steps.get(1),
            steady_step=steps.get(2), compiles=sum(t["compiles"] for t in programs.values()),
            programs={name: {k: round(v, 2) for k, v in t.items()}
                      for name, t in sorted(programs.items(),
                                            key=lambda kv: -kv[1]["compile_s"])[:12]},
            log_tail=None if code == 0 else log[-1500:]))
