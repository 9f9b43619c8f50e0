"""The engine protocol of rollout/: one set of settings (`Settings`; rollout/sampler.Sampling
runs them), one decode state (`DecodeState`, what every decode loop carries, and its
`Recorded` outputs), one draw (`draw`), the engines by name (`GENERATE`), and one table of
what each engine records and reads (`ENGINES`, `refuse`).

An engine that starts from prompts is one function

    generate(params, prompt_tokens, prompt_mask, key, row_limits, *, sampling, row_ids,
             inputs) -> (Rollout, DecodeStats)

prompts (B / G, P) left-padded; row_limits (B,) int32 in [1, N]; row_ids (B,) int32, the r of
each row's draws; inputs the prompts' PromptInputs (models/prompt_inputs.py; None for text);
params as `read_params` prepares them. The two are `static` (rollout/static.py: all
rows decode together) and `refill` (rollout/refill.py: S decode slots, a finished row's slot
taking the next pending row); rollout/sampler.py picks one (`Settings.engine`).

The engines that continue from a cache instead of a prefill are `continuation`
(rollout/continuation.continue_turn: B episodes, each turn running only its new ids) and
`slot_continuation` (rollout/slot_continuation.continue_slots: S of them, whichever are
ready). Above them, `episodes` names the turn players (rollout/episodes/: host, pure-JAX,
asynchronous) that stitch an episode's turns together.

Every engine draws token t of row r with token_uniforms(key, r, t) (`draw`), so all of them
draw the same tokens. The teacher-forced score (log-probs, entropy) is
models/scoring.completion_scores, the learner's own pass, so the learner never imports rollout/.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.errors import ConfigError
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.layout import compute_copy, split_layers
from grpo_jax.models.partitioning import shardings
from grpo_jax.models.quantized import WEIGHT_DTYPES, quantize_layers
from grpo_jax.rollout.sampling import choose_tokens, token_uniforms


DECODE_LOOPS = ("segments", "bounded")  # the static engine's (rollout/static.py)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What a sampler call needs besides params, prompts and key: the model, the lengths and
  special tokens, the sampling policy, and the mesh (hashable: a jit-static value)."""
  model_cfg: ModelConfig
  max_new_tokens: int
  eos_id: int
  pad_id: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  mesh: Any = None
  group_size: int = 1  # sample rows per prompt row (prefix sharing)
  decode_block: int = 0  # decode steps per segment; <= 0: one segment reading all slots
  decode_slots: int = 0  # slot-refill engine with min(this, rows) slots; 0: static
  decode_loop: str = "auto"  # the static engine's (DECODE_LOOPS); auto: the platform table
  # Record each token's top-k / top-p truncation (Rollout.keep_cutoff, kept_logmass) for the
  # keep-sampling mask (rl.keep_sampling_mask); the tokens and log-probs do not change.
  keep_mask: bool = False
  # Record a mixture of experts' routing (Rollout.routes) for routing replay and its mismatch
  # metric (rl.routing_replay).
  record_routes: bool = False
  # rollout.weight_dtype: the sampler reads the layers' kernels quantised to this dtype
  # ("int8"; models/quantized.py), a copy made inside the call; "" = the params as given.
  weight_dtype: str = ""

  def __post_init__(self):
    """One ConfigError sentence for a setting no sampler can run, before any compute (a run's
    config is checked earlier, in config.py; this guards a direct call)."""
    for name, ok, must in (("max_new_tokens", self.max_new_tokens >= 1, "at least 1"),
                           ("group_size", self.group_size >= 1, "at least 1"),
                           ("temperature", self.temperature >= 0, ">= 0 (0 = greedy)"),
                           ("top_k", self.top_k >= 0, ">= 0 (0 = off)"),
                           ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
                           ("decode_slots", self.decode_slots >= 0, ">= 0 (0 = static)"),
                           ("decode_loop", self.decode_loop in ("auto", *DECODE_LOOPS),
                            "'auto', " + " or ".join(map(repr, DECODE_LOOPS))),
                           ("weight_dtype", self.weight_dtype in ("", *WEIGHT_DTYPES),
                            "'' (the params as given) or one of " + str(sorted(WEIGHT_DTYPES)))):
      if not ok:
        raise ConfigError(f"sampling {name}={getattr(self, name)!r}; use {must}.")
    if self.record_routes and not self.model_cfg.num_experts:
      raise ConfigError("sampling record_routes=True records a mixture of experts' routing, "
                        "and this model has none (num_experts=0); leave it False.")

  @classmethod
  def of(cls, model_cfg: ModelConfig, task, rollout_cfg, mesh=None,
         max_new_tokens: int | None = None) -> "Settings":
    """The rollout's sampling for a task (its eos / pad) and a config's rollout section, one
    row per prompt row (`grouped` for G)."""
    return cls(model_cfg, max_new_tokens or rollout_cfg.max_new_tokens, task.eos_id,
               task.pad_id, rollout_cfg.temperature, rollout_cfg.top_k, rollout_cfg.top_p,
               mesh, 1, getattr(rollout_cfg, "decode_block", 0),
               getattr(rollout_cfg, "decode_slots", 0),
               decode_loop=getattr(rollout_cfg, "decode_loop", "auto"))

  @property
  def engine(self) -> str:
    """The engine that starts from prompts: "refill" with decode slots, else "static"."""
    return "refill" if self.decode_slots > 0 else "static"

  def greedy(self) -> "Settings":
    """Greedy, one row per prompt."""
    return dataclasses.replace(self, temperature=0.0, top_k=0, top_p=1.0, group_size=1)

  def grouped(self, group_size: int, keep_mask: bool = False,
              record_routes: bool = False) -> "Settings":
    """group_size sampled rows per prompt row, the prompt prefilled once; keep_mask: record
    the truncation of each token (the training rollout under rl.keep_sampling_mask);
    record_routes: record a mixture's routing (the training rollout of an MoE model)."""
    return dataclasses.replace(self, group_size=group_size, keep_mask=keep_mask,
                               record_routes=record_routes and bool(self.model_cfg.num_experts))

  def quantized(self, weight_dtype: str) -> "Settings":
    """The sampler reading a `weight_dtype` copy of the layers' kernels ("": full precision):
    the training rollout under rollout.weight_dtype."""
    return dataclasses.replace(self, weight_dtype=weight_dtype)


def read_params(params, sampling: Settings):
  """The params as every engine's passes read them, prepared once per call, not per decode
  step: the layers' kernels quantised to sampling.weight_dtype (models/quantized.py), else the
  matrices cast to the compute dtype; the stacked layers sliced (models/layout.split_layers).
  With the sampler's mesh, laid out by its rules (mesh.SAMPLER_RULES): gathered over
  data x fsdp x context once here, so the prefill and every decode step read one copy."""
  if sampling.weight_dtype:
    params = quantize_layers(params, sampling.weight_dtype)
  else:
    params = compute_copy(params, sampling.model_cfg.dtype)
  if sampling.mesh is not None:
    params = jax.lax.with_sharding_constraint(params, shardings(params, sampling.mesh))
  return split_layers(params, sampling.model_cfg.num_layers)


def draw(logits, key, rows, t, sampling: Settings, keep_mask: bool = False):
  """(token, logp, kept) (B,) of rows `rows` (B,) at completion positions t (() or (B,)):
  sampling.choose_tokens with the uniforms token_uniforms(key, rows, t); kept None unless
  keep_mask and the sampling truncates."""
  return choose_tokens(logits, token_uniforms(key, rows, t), sampling.temperature,
                       sampling.top_k, sampling.top_p, keep_mask)


def select_rows(pick, new, old):
  """new where pick (B,), old elsewhere, leaf by leaf (a pytree of (B, ...) leaves)."""
  return jax.tree.map(lambda n, o: jnp.where(pick.reshape((-1,) + (1,) * (n.ndim - 1)), n, o),
                      new, old)


class Recorded(NamedTuple):
  """What a decode loop writes, (B, N) per row and completion position."""
  tokens: jax.Array  # int32, pad_id where nothing was drawn
  logprobs: jax.Array  # float32, 0 where nothing was drawn
  mask: jax.Array  # bool, True where a token was drawn
  kept: Any = None  # None, or the truncation's (keep_cutoff, kept_logmass), float32 each
  routes: Any = None  # None, or a mixture's experts of each completion token (B, N, L, k) int32

  @classmethod
  def empty(cls, rows: int, new: int, pad_id: int, keeps: bool = False,
            route_shape: tuple | None = None) -> "Recorded":
    """Nothing recorded yet; keeps: room for the truncation; route_shape (L, k): for routes."""
    zeros = lambda: jnp.zeros((rows, new), jnp.float32)  # noqa: E731
    return cls(jnp.full((rows, new), pad_id, jnp.int32), zeros(), jnp.zeros((rows, new), bool),
               (zeros(), zeros()) if keeps else None,
               None if route_shape is None else jnp.zeros((rows, new, *route_shape), jnp.int32))

  def write(self, t, live, token, logp, kept, pad_id: int, rows=None) -> "Recorded":
    """Token t of every row (rows None: all at the one position t; where not live: pad_id, 0
    and False), or of the rows `rows` (S,) at their positions t (S,) (a slot that is not live
    names a row out of range, and its write is dropped)."""
    if rows is None:
      put = lambda out, value, fill: out.at[:, t].set(jnp.where(live, value, fill))  # noqa: E731
    else:
      put = lambda out, value, fill: out.at[rows, t].set(value, mode="drop")  # noqa: E731
    kept_out = self.kept
    if kept is not None:
      kept_out = tuple(put(o, k, 0.0) for o, k in zip(self.kept, kept))
    return self._replace(tokens=put(self.tokens, token, pad_id),
                         logprobs=put(self.logprobs, logp, 0.0),
                         mask=put(self.mask, True, False), kept=kept_out)

  def write_routes(self, t, routes, rows=None) -> "Recorded":
    """The experts (B or S, L, k) of the tokens forwarded at position t (rows as in `write`;
    rows None: 0 for a row that drew no token at t, whose forward ran on padding)."""
    if self.routes is None:
      return self
    if rows is None:
      drawn = self.mask[:, t][:, None, None]
      return self._replace(routes=self.routes.at[:, t].set(jnp.where(drawn, routes, 0)))
    return self._replace(routes=self.routes.at[rows, t].set(routes, mode="drop"))


class DecodeState(NamedTuple):
  """What every decode loop carries: each row's (or slot's) current token, drawn and not yet
  recorded, the cache it is forwarded into, and what has been recorded."""
  t: jax.Array  # () or (B,) int32: the completion position of the current token
  token: jax.Array  # (B,) int32
  logp: jax.Array  # (B,) float32: its log-prob
  kept: Any  # None, or its truncation's (cutoff, kept_logmass), (B,) float32 each
  cache: Any  # the KV cache (models/kv_cache.init_cache)
  done: jax.Array  # (B,) bool: the row (a slot: its row) draws nothing more
  kv_mask: Any  # the slots a forward reads: (B, slots) bool, the pair (the prompts', the
  # rows' own) of a shared prompt cache, or None (continuation masks by position)
  recorded: Recorded


# The engines that start from prompts, by name (Settings.engine): each module registers its
# generate function (`generator`), so rollout/sampler.py runs GENERATE[settings.engine].
GENERATE: dict = {}


def generator(name: str):
  """Registers the decorated function as engine `name`'s generate (the module docstring)."""
  def add(fn):
    GENERATE[name] = fn
    return fn
  return add


# What an engine cannot record or read, each with the one sentence why (a feature not named
# runs). Features: keep_mask (rl.keep_sampling_mask), record_routes (a mixture's routing for
# rl.routing_replay), weight_dtype (rollout.weight_dtype), images (model.vision).
_STITCHED = ("an episode's rows are stitched together from its turns on the host "
             "(rollout/episodes/), which carry tokens, log-probs and masks only")
_TEXT_EPISODES = "an episode's observations are text: the environments hand back no image"
# The turn players and the continuation engines they run: every episode stitched from turns.
_TURNS = {"keep_mask": _STITCHED, "record_routes": _STITCHED, "images": _TEXT_EPISODES}
ENGINES = {"static": {}, "refill": {}, "continuation": _TURNS, "slot_continuation": _TURNS,
           "episodes": _TURNS}
_ASKED_BY = {"keep_mask": "rl.keep_sampling_mask=True",
             "record_routes": "rl.routing_replay='rollout'",
             "weight_dtype": "rollout.weight_dtype", "images": "model.vision"}


def refuse(engines, features) -> None:
  """ConfigError, one sentence, for the first of `features` (names of ENGINES' columns) that
  one of `engines` cannot record or read; nothing when all run."""
  for engine in engines:
    for feature in features:
      why = ENGINES[engine].get(feature)
      if why:
        raise ConfigError(f"{_ASKED_BY[feature]} asks the {engine!r} engine for what it cannot "
                          f"give: {why}; turn it off for this run.")
