"""What the teacher-forced passes no longer compute. Packed completion tokens (rl.pack_tokens,
grpo_jax/models/packing.py): the per-token work on the real completion tokens only; the index,
the pack / unpack pair and the capacity rule against NumPy references; scores, gradients and
the whole RL step equal to the unpacked ones up to float32 rounding; the loop's capacities; the
refusals. Causal query blocks (models/attention.py): equal to the whole attention."""

import dataclasses
import itertools
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.config import ConfigError
from grpo_jax.defaults import rl_defaults
from grpo_jax.models.attention import causal_blocked_attention, grouped_query_attention
from grpo_jax.models.attention import attention_mask
from grpo_jax.models.packing import pack_tokens, packed_index, token_capacity, unpack_tokens
from grpo_jax.models.scoring import completion_scores
from grpo_jax.rollout.sampler import generate
from grpo_jax.train.stages import rl as loop
from grpo_jax.train.stages import rl_checks
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.learner.state import create_train_state
from grpo_jax.train.learner.step import StepSpec, make_rl_step
from tests.fixtures import perturbed_params, small_tiny_config, tiny_model_config
from tests.test_shared_prompt import G, _seqs


def test_pack_and_unpack_are_the_masked_entries_in_row_major_order():
  rng = np.random.default_rng(0)
  mask = rng.random((3, 5)) < 0.5
  x = rng.normal(size=(3, 5, 2)).astype(np.float32)
  index = np.asarray(packed_index(jnp.asarray(mask), 10))
  count = int(mask.sum())
  np.testing.assert_array_equal(index[:count], np.flatnonzero(mask))
  assert np.all(index[count:] == 15)  # one past the end
  packed = np.asarray(pack_tokens(jnp.asarray(x), jnp.asarray(index)))
  assert packed.shape == (1, 10, 2)
  np.testing.assert_array_equal(packed[0, :count], x[mask])
  assert np.all(packed[0, count:] == 0)
  back = np.asarray(unpack_tokens(jnp.asarray(packed), jnp.asarray(index), 3, 5))
  np.testing.assert_array_equal(back, np.where(mask[..., None], x, 0))


def _capacity_reference(lengths, rows_per_piece, width, buckets):
  """The most tokens any choice of rows_per_piece rows holds, by enumeration, rounded up."""
  lengths = np.minimum(np.atleast_2d(lengths), width)
  most = max(sum(c) for batch in lengths for c in itertools.combinations(batch, rows_per_piece))
  unit = -(-rows_per_piece * width // buckets)
  return min(rows_per_piece * width, max(1, -(-most // unit)) * unit)


@pytest.mark.parametrize("rows_per_piece,buckets", [(8, 8), (4, 8), (2, 3), (8, 1)])
def test_the_capacity_bounds_every_piece_and_takes_few_values(rows_per_piece, buckets):
  rng = np.random.default_rng(1)
  seen = set()
  for _ in range(40):
    lengths = rng.integers(0, 40, (2, 8))  # two seeds' batches; lengths past the width clip
    got = token_capacity(lengths, rows_per_piece, 31, buckets)
    assert got == _capacity_reference(lengths, rows_per_piece, 31, buckets)
    seen.add(got)
  assert len(seen) <= buckets


@pytest.mark.parametrize("remat,chunk,group", [("none", 0, 1), ("full", 0, G), ("full", 4, G),
                                               ("none", 4, 1)])
def test_packed_scores_and_gradients_equal_the_unpacked_ones(remat, chunk, group):
  cfg = dataclasses.replace(tiny_model_config(), remat=remat, logits_chunk=chunk)
  params = perturbed_params(tiny_model_config(), seed=3)
  seqs = _seqs()
  mask = seqs.completion_mask
  seqs.keep_cutoff = jnp.where(mask, -2.5, 0.0) if chunk else None  # a kept set, renormalised
  capacity = token_capacity(mask.sum(1), 9, 5, 9)  # 40 slots for 39 tokens
  assert capacity < int(mask[:, :-1].size)  # something is really left out

  def loss(p, capacity):
    logp, entropy, hidden = completion_scores(p, cfg, seqs, 0.8, True, group, capacity)
    return jnp.sum(jnp.where(mask, 0.7 * logp + 0.1 * entropy, 0.0)), (logp, entropy, hidden)

  grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (want_loss, want), want_grads = grad(params, None)
  (got_loss, got), got_grads = grad(params, capacity)
  assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
  for g, w in zip(got, want):  # log-probs, entropies, hidden states, where the tokens exist
    m = mask if g.ndim == 2 else mask[..., None]
    np.testing.assert_allclose(np.where(m, g, 0), np.where(m, w, 0), rtol=0, atol=1e-5)
  worst = max(float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
              for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)))
  assert worst < 1e-5  # measured 2.5-2.9e-6


CFG = tiny_model_config(vocab_size=16)
PROMPTS = np.repeat(np.array([[1, 5, 6], [1, 9, 4], [0, 1, 3], [1, 12, 11]], np.int32), 4, 0)


def _two_steps(rl, capacity):
  """Two RL steps (prepare + update + end of step) with SGD on a rollout whose rows end after
  1 to 6 of their 6 tokens."""
  optimizer = optax.sgd(0.1)
  state = create_train_state(perturbed_params(CFG, 0), optimizer, jax.random.key(1), None,
                             rl.kl_coef)
  state = state.replace(ref_params=perturbed_params(CFG, 1))
  rollout = generate(perturbed_params(CFG, 7), PROMPTS, PROMPTS != 0, jax.random.key(0),
                     model_cfg=CFG, max_new_tokens=6, temperature=1.0, eos_id=-1, pad_id=0)
  ends = np.array([6, 2, 4, 1, 5, 6, 3, 2, 1, 6, 4, 4, 2, 5, 3, 1])
  mask = jnp.asarray(np.arange(6) < ends[:, None])
  rollout = rollout._replace(completion_mask=mask, action_mask=mask,
                             logprobs=jnp.where(mask, rollout.logprobs, 0.0),
                             truncated=jnp.asarray(ends == 6))
  inputs = RewardInputs(jax.random.uniform(jax.random.key(9), (len(PROMPTS),)), {},
                        jnp.int32(0))
  step = jax.jit(make_rl_step(StepSpec(CFG, rl, optimizer, 4, 1.0, 6, capacity)))
  history = []
  for _ in range(2):
    state, metrics = step(state, rollout, inputs)
    history.append({k: float(v) for k, v in metrics.items()})
  lengths = np.asarray(rollout.completion_mask).sum(1)
  return state, history, lengths


@pytest.mark.parametrize("overrides", [
    dict(shared_prompt_forward=True),  # the reference pass and the update, old log-probs reused
    dict(reuse_old_logprobs=False, num_micro_batches=2),  # old log-probs by their own pass
    dict(num_iterations=2, num_minibatches=2, reuse_old_logprobs=False, kl_coef=0.0),
])
def test_the_packed_rl_step_equals_the_unpacked_one(overrides):
  rl = rl_defaults(**{"kl_coef": 0.04, **overrides})
  want_state, want, lengths = _two_steps(rl, None)
  pieces = rl.num_minibatches * rl.num_micro_batches
  capacity = token_capacity(lengths, len(PROMPTS) // pieces, 5, 80)  # 1-token steps
  assert capacity < len(PROMPTS) // pieces * 5  # the rows end early: some slots are left out
  got_state, got, _ = _two_steps(rl, capacity)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in
              zip(jax.tree.leaves(want_state.params), jax.tree.leaves(perturbed_params(CFG, 0))))
  worst = max(float(jnp.max(jnp.abs(g - w))) for g, w in
              zip(jax.tree.leaves(got_state.params), jax.tree.leaves(want_state.params)))
  assert moved > 1e-2 and worst < 1e-5, (moved, worst)  # rounding: worst measured 0.5-4e-6
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for key in ("loss", "pg_loss", "kl", "rollout_kl", "clip_frac", "ratio", "entropy"):
      assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-5), key  # measured <= 1.2e-6


def test_a_packed_run_records_its_capacities_and_learns_the_same(tmp_path):
  records = {}
  for pack in (0, 4):
    config = small_tiny_config(steps=3, num_minibatches=1)
    config.rl.pack_tokens = pack
    loop.train(config, str(tmp_path / str(pack)), log=lambda *_: None)
    with open(tmp_path / str(pack) / "metrics.jsonl") as f:
      records[pack] = [r for r in map(json.loads, f) if "loss" in r]
  width = small_tiny_config().rollout.max_new_tokens - 1
  full = 16 * width  # one piece of 16 rows
  capacities = {r["packed_token_capacity"] for r in records[4]}
  assert capacities <= {min(full, k * -(-full // 4)) for k in range(1, 5)}
  assert all("packed_token_capacity" not in r for r in records[0])
  for got, want in zip(records[4], records[0]):
    for key in ("loss", "kl", "reward_mean", "entropy"):
      assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key


def test_packing_is_refused_where_the_host_does_not_size_it():
  from grpo_jax.train.sources.experience_source import SourceSettings  # noqa: PLC0415
  config = small_tiny_config(steps=1)
  config.rl.pack_tokens = 8
  config.train.experience_source = "fused"
  with pytest.raises(ConfigError, match=r"^rl.pack_tokens=8 sizes each step's packed tokens on "
                                        r"the host, but train.experience_source='fused'"):
    rl_checks.check_source(config.train, config.rl)
  mesh = types.SimpleNamespace(shape={"data": 2, "fsdp": 1, "tensor": 1, "expert": 1})
  with pytest.raises(ConfigError, match=r"^rl.pack_tokens=8 packs a micro-batch's tokens into "
                                        r"one row, which does not split over the 2 data"):
    rl_checks.check_batches_fit_mesh(config.rl, SourceSettings.of(config),
                                     config.train.eval_batch_size, mesh)


@pytest.mark.parametrize("offset,queries", [(0, 300), (7, 130), (5, 64)])
def test_causal_query_blocks_equal_the_whole_attention(offset, queries):
  """Queries at slots offset.. (a prompt of `offset` slots before them, two of them padding),
  6 heads over 2 kv heads: blocks of 128 queries against the keys up to their block's end."""
  rng = np.random.default_rng(0)
  keys = offset + queries
  q = jnp.asarray(rng.normal(size=(2, queries, 6, 8)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(2, 2, keys, 8)), jnp.float32) for _ in range(2))
  kv_mask = jnp.ones((2, keys), bool).at[1, :min(2, offset)].set(False)
  mask = attention_mask(kv_mask, queries, offset)
  got = causal_blocked_attention(q, k, v, mask, offset)
  want = grouped_query_attention(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-6)
