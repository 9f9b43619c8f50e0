"""Shared pieces of the performance benchmarks: random Qwen2-shaped checkpoints, timing, and
a header naming the machine, the date, the command and the commit.

The checkpoints are written with transformers (``Qwen2ForCausalLM(config).save_pretrained``,
float32, no tokenizer: the benchmarks feed token ids) and cached under
``$GRPO_BENCH_DIR`` (default ``/tmp/grpo_jax_bench``).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# name -> Qwen2 shape (vocab 32k; GQA; q/k/v biases; tied embeddings like Qwen2.5-0.5B).
SHAPES = {
    "qwen2-4L-256": dict(num_hidden_layers=4, hidden_size=256, intermediate_size=704,
                         num_attention_heads=4, num_key_value_heads=2),
    "qwen2-8L-512": dict(num_hidden_layers=8, hidden_size=512, intermediate_size=1408,
                         num_attention_heads=8, num_key_value_heads=2),
    "qwen2-12L-768": dict(num_hidden_layers=12, hidden_size=768, intermediate_size=2048,
                          num_attention_heads=12, num_key_value_heads=4),
    # Qwen2.5-0.5B(-Instruct)'s config.json shape (random weights; the word tokenizer uses
    # only the first VOCAB ids of its 151936).
    "qwen2.5-0.5b": dict(num_hidden_layers=24, hidden_size=896, intermediate_size=4864,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151_936,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6),
}
VOCAB = 32_000
PAD_ID, UNK_ID, EOS_ID = 0, 1, 2  # word tokenizer's specials; prompts use ids >= 3


def bench_dir() -> str:
  return os.environ.get("GRPO_BENCH_DIR", "/tmp/grpo_jax_bench")


def checkpoint(name: str, seed: int = 0) -> str:
  """The directory of random checkpoint `name` (see SHAPES), written once."""
  directory = os.path.join(bench_dir(), name)
  if os.path.isfile(os.path.join(directory, "model.safetensors")):
    return directory
  import torch
  from transformers import Qwen2Config, Qwen2ForCausalLM
  torch.manual_seed(seed)
  config = Qwen2Config(**{**dict(vocab_size=VOCAB), **SHAPES[name]},
                       max_position_embeddings=4096, tie_word_embeddings=True,
                       bos_token_id=None, eos_token_id=None, pad_token_id=PAD_ID)
  Qwen2ForCausalLM(config).float().save_pretrained(directory)
  return directory


def num_params(name: str) -> int:
  """Parameter count of checkpoint `name` (embeddings counted once: they are tied)."""
  s = SHAPES[name]
  h, i, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
  head = h // s["num_attention_heads"]
  kv = s["num_key_value_heads"] * head
  attn = h * h + h + 2 * (h * kv + kv) + h * h
  return s.get("vocab_size", VOCAB) * h + layers * (attn + 3 * h * i + 2 * h) + h


def random_prompts(batch: int, length: int, seed: int = 0):
  """(tokens, mask) of `batch` full-length prompts of random ids in [3, VOCAB)."""
  import numpy as np
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, VOCAB, size=(batch, length), dtype=np.int32)
  return tokens, np.ones_like(tokens, bool)


def word_tokenizer():
  """A transformers tokenizer for the random checkpoints: id i <-> the word "t{i}" (ids 0-2 are
  <pad>, <unk>, <eos>), split on spaces, so a prompt of n words is exactly n tokens."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  vocab = {"<pad>": PAD_ID, "<unk>": UNK_ID, "<eos>": EOS_ID}
  vocab.update({f"t{i}": i for i in range(3, VOCAB)})
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                 eos_token="<eos>")


# The glibc settings of grpo_jax.host_allocator as GLIBC_TUNABLES, for a peer's process
# (--peer-malloc tuned): the same allocator behaviour, set before the process starts.
TUNED_GLIBC = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
               "glibc.malloc.trim_threshold=68719476736:glibc.malloc.top_pad=1073741824")


def ours_setup() -> str:
  """Applies grpo_jax.main's host-allocator settings in this (our side's) process; returns a
  phrase for the table's settings line."""
  from grpo_jax.host_allocator import tune_host_allocator
  return "tuned glibc malloc" if tune_host_allocator() else "default malloc"


def peer_env(peer_malloc: str) -> dict:
  """Extra environment of a peer's process: with "tuned", the same glibc settings as ours."""
  return {"GLIBC_TUNABLES": TUNED_GLIBC} if peer_malloc == "tuned" else {}


def torch_setup(threads: int) -> str:
  """Sets torch's intra-op threads; returns a description of the torch settings."""
  import torch
  torch.set_num_threads(threads)
  malloc = "tuned glibc malloc" if os.environ.get("GLIBC_TUNABLES") else "default malloc"
  return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, {malloc}")


def alternate(rounds: int, ours, peer) -> list:
  """[(ours result, peer result)] over `rounds` rounds run in the order A B, B A, A B, ...:
  on a shared machine whose load drifts, neither side always runs first."""
  out = []
  for r in range(rounds):
    if r % 2 == 0:
      a = ours()
      b = peer()
    else:
      b = peer()
      a = ours()
    out.append((a, b))
  return out


def run_side(script: str, args: list, env_extra: dict | None = None) -> dict:
  """Runs `python script args` (one side of a comparison, in its own process so that the two
  frameworks' thread pools never share a process) and returns the JSON on its last line."""
  import json
  env = dict(os.environ, **(env_extra or {}))
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True,
                       text=True)
  if out.returncode != 0:
    raise RuntimeError(f"{script} {' '.join(args)} failed:\n{out.stderr[-4000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def time_it(fn, repeats: int = 3, warmup: int = 1) -> list:
  """Wall seconds of `repeats` calls of fn() after `warmup` untimed calls (compilation).

  fn must block until its work is done (block_until_ready / a host value). The benchmarks
  report the best (minimum) time: on a shared machine the others mostly measure the neighbours.
  """
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def commit() -> str:
  """HEAD's hash, with '+dirty' when the worktree has uncommitted changes."""
  run = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True,  # noqa: E731
                                  text=True).stdout.strip()
  return run("rev-parse", "--short", "HEAD") + ("+dirty" if run("status", "--porcelain",
                                                                "--untracked-files=no") else "")


def cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def memory_gib() -> float:
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (ValueError, OSError, AttributeError):
    return float("nan")


def header() -> str:
  """Date, machine, command line and commit, for the top of a results table."""
  import jax
  cores = os.cpu_count()
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  lines = [f"date: {datetime.date.today().isoformat()}",
           f"machine: {cpu_name()}, {cores} cores, {memory_gib():.0f} GiB, {platform.machine()}, "
           f"jax {jax.__version__} on {jax.devices()[0].platform}, "
           f"load average at start {load:.2f}",
           f"command: python {' '.join(sys.argv)}",
           f"commit: {commit()}"]
  return "\n".join(lines)


def table(headers: list, rows: list) -> str:
  """A Markdown table."""
  out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(out)
