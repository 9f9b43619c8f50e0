"""How this backend runs `jax.lax.ragged_dot` (the MoE experts' grouped matmul, models/moe.py)
at Qwen3-30B-A3B's expert shape: XLA's FLOP count, the op it compiles to, and the time of one
call against a plain matmul of the same (active) size and against every expert computed for
every token.

    python benchmarks/ragged_dot.py [--tokens 4096] [--dtype bfloat16]

One JSON line ends the output (keys: backend, tokens, experts, ragged_gflop, active_gflop,
all_experts_gflop, ragged_ms, active_ms, all_experts_ms, native).
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp


def timed(fn, *args, calls=10) -> float:
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(calls):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls * 1e3


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tokens", type=int, default=4096, help="token-expert assignments (N x k)")
  p.add_argument("--hidden", type=int, default=2048)
  p.add_argument("--inner", type=int, default=768, help="moe_intermediate_size")
  p.add_argument("--experts", type=int, default=128)
  p.add_argument("--dtype", default="bfloat16")
  a = p.parse_args()
  m, h, i, e = a.tokens, a.hidden, a.inner, a.experts
  dt = jnp.dtype(a.dtype)
  key = jax.random.key(0)
  x = jax.random.normal(key, (m, h), dt)
  w = jax.random.normal(key, (e, h, i), dt) * 0.02
  sizes = jnp.full((e,), m // e, jnp.int32).at[0].add(m - e * (m // e))
  ragged = jax.jit(lambda x, w, g: jax.lax.ragged_dot(x, w, g))
  active = jax.jit(lambda x, w: x @ w[0])
  every = jax.jit(lambda x, w: jnp.einsum("mh,ehi->emi", x, w))
  compiled = ragged.lower(x, w, sizes).compile()
  text = compiled.as_text()
  flops = lambda c: c.cost_analysis()["flops"] / 1e9  # noqa: E731
  out = dict(backend=jax.default_backend(), device=jax.devices()[0].device_kind, tokens=m,
             experts=e, ragged_gflop=round(flops(compiled), 2),
             active_gflop=round(flops(active.lower(x, w).compile()), 2),
             all_experts_gflop=round(flops(every.lower(x, w).compile()), 2),
             ragged_ms=round(timed(ragged, x, w, sizes), 3),
             active_ms=round(timed(active, x, w), 3),
             all_experts_ms=round(timed(every, x, w), 3),
             native=any("ragged-dot(" in line or "ragged_dot(" in line
                        for line in text.splitlines() if "metadata" not in line.split("=")[0]))
  print(f"{out['backend']} ({out['device']}): ragged_dot of {m} rows over {e} experts "
        f"({h} -> {i}): {out['ragged_gflop']} GFLOP counted, {out['ragged_ms']} ms; the active "
        f"matmul {out['active_gflop']} GFLOP, {out['active_ms']} ms; every expert for every row "
        f"{out['all_experts_gflop']} GFLOP, {out['all_experts_ms']} ms; a ragged op in the "
        f"compiled module: {out['native']}")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
