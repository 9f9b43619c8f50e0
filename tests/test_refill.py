"""The slot-refill engine (rollout.decode_slots): the same rows give the same tokens and masks
as the static engine, with any number of slots; its loop does the decode work a plain
simulation of the schedule predicts.

Log-probs are compared within 1e-5, not bit for bit: XLA:CPU's matmul rounds a row's last bits
differently with the number of rows in the product (a (3, 256) x (256, 1024) product differs
from the first 3 rows of a (64, 256) one by up to 4e-5), and the slot engine runs its forwards
over S rows where the static one runs B. The drawn tokens use the same uniform for (row, t) in
both (`token_uniforms`), so they agree exactly.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from grpo_jax.parallel.choices import choose
from grpo_jax.rollout.refill import generate_refill, shrink_phases
from grpo_jax.rollout.sampler import Sampling, sample
from grpo_jax.rollout.types import row_limits_or_max
from tests.fixtures import perturbed_params, xla_env
from tests.test_sampler_prefix import _assert_same  # tokens, masks exact; log-probs 1e-5

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOS, PAD = 2, 0
PROMPTS = np.array([[0, 0, 3, 7, 9], [5, 6, 7, 8, 9], [0, 0, 0, 1, 4]], np.int32)
PROMPT_MASK = PROMPTS != 0
GROUP, NEW = 4, 11
ROWS = len(PROMPTS) * GROUP
LIMITS = np.random.default_rng(0).integers(1, NEW + 1, size=ROWS).astype(np.int32)
POLICIES = [dict(temperature=0.0), dict(temperature=1.0),
            dict(temperature=0.8, top_k=6, top_p=0.9)]


def _params(cfg):
  params = perturbed_params(cfg, seed=5)
  # <eos> likely, so rows end at very different lengths (some at once, some at the limit).
  params["embed_tokens"]["embedding"] = params["embed_tokens"]["embedding"].at[EOS].multiply(3.0)
  return params


def _settings(cfg, **policy):
  return dict(model_cfg=cfg, max_new_tokens=NEW, eos_id=EOS, pad_id=PAD, group_size=GROUP,
              **policy)


def _refill(cfg, params, slots, limits=None, **policy):
  """The slot engine itself (also for slots = rows, which `sample` would run statically)."""
  limits = row_limits_or_max(limits, ROWS, NEW)  # one compiled engine for both limit cases
  return _refill_fn(cfg, slots, tuple(sorted(policy.items())))(
      params, PROMPTS, PROMPT_MASK, jax.random.key(7), limits)


@functools.lru_cache(maxsize=None)
def _refill_fn(cfg, slots, policy):
  sampling = Sampling(**_settings(cfg, decode_slots=slots, **dict(policy)))
  return jax.jit(lambda p, t, m, k, lim: generate_refill(p, t, m, k, lim, sampling=sampling))


def simulated_slot_steps(lengths, slots: int) -> int:
  """A plain loop over the schedule: free slots take the next rows in row order, each busy
  slot records one token per iteration, and once nothing is pending and the busy slots fit in
  the next phase, that phase's fewer slots take them (`shrink_phases`)."""
  phases = shrink_phases(slots, choose("rollout.refill_shrink"))
  pending, busy, steps, phase = list(lengths), [], 0, 0
  while pending or busy:
    if not pending:
      while phase + 1 < len(phases) and len(busy) <= phases[phase + 1]:
        phase += 1
    while len(busy) < phases[phase] and pending:
      busy.append(pending.pop(0))
    steps += phases[phase]
    busy = [b - 1 for b in busy if b > 1]
  return steps


def test_shrink_phases():
  assert shrink_phases(16) == [16, 8, 4, 2, 1]
  assert shrink_phases(3) == [3, 1]
  assert shrink_phases(1) == [1]
  assert shrink_phases(256) == [256, 128, 64, 32, 16, 8]
  assert shrink_phases(64, 0.75) == [64, 48, 36, 27, 20, 15, 11, 8, 6, 4, 3, 2]
  assert shrink_phases(8, 0.75) == [8, 6, 4, 3, 2, 1]


# The slot counts each policy's engine is checked at: every count (ROWS, ROWS / 2, ROWS / 4, 3)
# under both row limits by at least one policy, instead of every count under every policy (each
# count compiles an engine of its own: 60 s a case in CI, 2026-12-05).
SLOT_COUNTS = [(ROWS, ROWS // 4), (ROWS // 2, 3), (ROWS // 4, ROWS)]


@pytest.mark.parametrize("policy,slot_counts", list(zip(POLICIES, SLOT_COUNTS)),
                         ids=["policy0", "policy1", "policy2"])
@pytest.mark.parametrize("limits", [None, LIMITS], ids=["eos", "row-limits"])
def test_refill_equals_static_for_every_slot_count(tiny_cfg, policy, slot_counts, limits):
  params = _params(tiny_cfg)
  static, stats = sample(params, PROMPTS, PROMPT_MASK, jax.random.key(7), limits,
                         decode_block=4, **_settings(tiny_cfg, **policy))
  lengths = np.asarray(static.completion_mask).sum(1)
  assert 1 <= lengths.min() and lengths.max() <= NEW and len(set(lengths.tolist())) >= 2
  if limits is not None:
    assert np.all(lengths <= LIMITS) and np.any(lengths == LIMITS)
  assert int(stats.slot_steps) == ROWS * lengths.max()
  for slots in slot_counts:
    got, got_stats = _refill(tiny_cfg, params, slots, limits, **policy)
    _assert_same(got, static)
    assert int(got_stats.slot_steps) == simulated_slot_steps(lengths, slots), slots
  # `sample` dispatches to the slot engine below one slot per row: the same result.
  got, _ = sample(params, PROMPTS, PROMPT_MASK, jax.random.key(7), limits, decode_slots=5,
                  **_settings(tiny_cfg, **policy))
  _assert_same(got, static)


def test_refill_with_one_slot(tiny_cfg):
  cfg = tiny_cfg
  params = _params(tiny_cfg)
  policy = dict(temperature=0.8, top_k=6, top_p=0.9)
  static, _ = sample(params, PROMPTS, PROMPT_MASK, jax.random.key(7), None,
                     **_settings(cfg, **policy))
  got, stats = _refill(cfg, params, 1, None, **policy)
  _assert_same(got, static)
  assert int(stats.slot_steps) == int(np.asarray(static.completion_mask).sum())  # no idle slot


@pytest.mark.slow
def test_refill_on_the_2x2x2_mesh_equals_one_device(tiny_cfg, tmp_path):
  """The slot engine on 8 CPU devices (data 2, fsdp 2, tensor 2; a subprocess with its own
  device count) gives the one-device engine's tokens and masks."""
  params = _params(tiny_cfg)
  policy = dict(temperature=0.8, top_k=6, top_p=0.9)
  want, _ = _refill(tiny_cfg, params, 4, LIMITS, **policy)
  out = subprocess.run(
      [sys.executable, "-m", "tests.mesh_worker", "refill", str(tmp_path / "mesh.json")],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=xla_env(8))
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads((tmp_path / "mesh.json").read_text())
  assert got["devices"] == 8
  np.testing.assert_array_equal(got["completion_tokens"], np.asarray(want.completion_tokens))
  np.testing.assert_array_equal(got["completion_mask"], np.asarray(want.completion_mask))
  np.testing.assert_allclose(got["logprobs"], np.asarray(want.logprobs), atol=1e-5)
