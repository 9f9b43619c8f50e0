"""Several seeds of one config as one program: a transform of the same step and the same loop.

A `SeedAxis` says how the run's per-seed values are held and how a function applies to them:
  "none"  one seed, values as they are (a plain run; meshes and multi-host apply);
  "vmap"  S seeds stacked on a leading axis, functions batched with jax.vmap (fastest; equal
          to separate runs up to float rounding, since XLA vectorises reductions differently);
  "map"   stacked likewise, functions looped over the seeds inside the program (jax.lax.map):
          op for op the shapes of a single run, so bit-identical to separate runs.
The host loop (grpo_jax/train/stages/rl.py) handles host values (prompts, rewards, records) as lists
of one entry per seed and crosses to device values with `stack` / `unstack`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.errors import ConfigError

SEED_AXES = ("none", "vmap", "map")


@dataclasses.dataclass(frozen=True)
class SeedAxis:
  seeds: tuple[int, ...]
  mode: str = "none"

  def __post_init__(self):
    if self.mode not in SEED_AXES:
      raise ConfigError(f"--seed_axis={self.mode!r} is unknown; valid: vmap, map.")
    if not self.seeds or len(set(self.seeds)) != len(self.seeds):
      raise ConfigError(f"--vmap_seeds={','.join(map(str, self.seeds))}: give distinct seeds, "
                        f"e.g. --vmap_seeds=0,1,2.")
    if self.mode == "none" and len(self.seeds) != 1:
      raise ConfigError(f"{len(self.seeds)} seeds need a seed axis (vmap or map).")

  @property
  def stacked(self) -> bool:
    return self.mode != "none"

  def __len__(self) -> int:
    return len(self.seeds)

  def transform(self, fn, in_axes=0):
    """fn applied to every seed's slice of its arguments (in_axes as in jax.vmap: 0 or None
    per positional argument; None = shared by all seeds)."""
    if self.mode == "none":
      return fn
    if self.mode == "vmap":
      return jax.vmap(fn, in_axes=in_axes)

    def mapped(*args):
      axes = in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
      batched = [a for a, ax in zip(args, axes) if ax is not None]

      def one(sliced):
        it = iter(sliced)
        return fn(*[next(it) if ax is not None else a for a, ax in zip(args, axes)])
      return jax.lax.map(one, batched)
    return mapped

  def compile(self, fn, in_axes=0, **jit_kwargs):
    """jax.jit of the transformed fn; with one seed and no jit options, fn as it is (so a
    plain run calls its jitted pieces, e.g. the sampler, exactly as they are)."""
    if self.mode == "none" and not jit_kwargs:
      return fn
    return jax.jit(self.transform(fn, in_axes), **jit_kwargs)

  def stack(self, values: list):
    """Per-seed trees -> one tree (stacked on a new leading axis; the one tree itself for a
    single seed)."""
    if self.mode == "none":
      (value,) = values
      return value
    return jax.tree.map(lambda *xs: jnp.stack(xs), *values)

  def unstack(self, tree) -> list:
    """Inverse of stack: one tree per seed."""
    if self.mode == "none":
      return [tree]
    return [jax.tree.map(lambda x: x[i], tree) for i in range(len(self.seeds))]
