"""Routing replay for a mixture of experts (rl.routing_replay, DeepSeek-V3.2's "keep routing"):
the sampler records each token's experts (Rollout.routes), the teacher-forced passes replay
them, and `routing_mismatch` measures how often a pass's own router would have chosen others;
the load-balancing loss (rl.router_aux_coef) in the update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.moe import load_balancing_loss, route, routes_differ
from grpo_jax.models.scoring import completion_logits
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.learner.forward import policy_and_values
from tests.fixtures import perturbed_params, small_tiny_config, tiny_model_config


def moe_config(**overrides):
  return tiny_model_config(**{**dict(vocab_size=32, num_layers=3, family="qwen3_moe",
                                     num_experts=4, experts_per_token=2, moe_intermediate_size=16,
                                     norm_topk_prob=True), **overrides})


def rollout_of(cfg, params, group=2, new_tokens=10, decode_slots=0):
  prompts = jax.random.randint(jax.random.key(1), (3, 6), 2, cfg.vocab_size)
  mask = jnp.ones((3, 6), bool).at[0, :3].set(False)  # one left-padded prompt
  sampling = Sampling(cfg, new_tokens, eos_id=1, pad_id=0, decode_slots=decode_slots).grouped(
      group, record_routes=True)
  return sampling(params, prompts, mask, jax.random.key(2))


def teacher_forced_routing(cfg, params, rollout):
  _, routing = completion_logits(params, cfg, rollout.prompt_tokens, rollout.prompt_mask,
                                 rollout.completion_tokens, rollout.completion_mask,
                                 record_routing=True)
  return routing


def test_route_replays_the_given_experts_weighted_by_this_router():
  logits = jax.random.normal(jax.random.key(0), (5, 6))
  given = jnp.array([[0, 3], [5, 1], [2, 2], [4, 0], [1, 5]], jnp.int32)
  weights, experts = route(logits, 2, True, given)
  probs = np.asarray(jax.nn.softmax(logits))
  picked = np.take_along_axis(probs, np.asarray(given), axis=1)
  np.testing.assert_array_equal(experts, given)
  np.testing.assert_allclose(weights, picked / picked.sum(1, keepdims=True), rtol=1e-6)
  assert not np.asarray(routes_differ(given, given[:, ::-1])).any()  # a set: order is free
  assert np.asarray(routes_differ(given, given.at[0, 1].set(2)))[0]


@pytest.mark.parametrize("decode_slots", [0, 4])  # the static engine, the slot-refill engine
def test_the_sampler_records_the_routing_a_teacher_forced_pass_recomputes(decode_slots):
  """Every prompt and completion token the sampler ran (the prefill, then each decode step)
  was routed as the full forward routes it, by either engine: zero mismatch on a float32
  model."""
  cfg = moe_config()
  params = perturbed_params(cfg)
  rollout = rollout_of(cfg, params, decode_slots=decode_slots)
  rows, prompt_len = rollout.prompt_tokens.shape
  new = rollout.completion_tokens.shape[1]
  assert rollout.routes.shape == (rows, prompt_len + new, cfg.num_layers, 2)
  own = teacher_forced_routing(cfg, params, rollout)["routes"]
  ran = np.concatenate([np.asarray(rollout.prompt_mask),
                        np.asarray(rollout.completion_mask)[:, :new - 1],
                        np.zeros((rows, 1), bool)], axis=1)
  assert ran[:, prompt_len:].sum() > 10
  differ = np.asarray(routes_differ(own, rollout.routes))
  assert not differ[ran].any()
  _, _, _, records = policy_and_values(params, None, rollout, cfg, "none", 1.0)
  assert records["mismatched"] == 0 and records["routed"] == ran[:, prompt_len:].sum() * 3


def test_both_engines_record_the_same_routes_and_none_for_tokens_not_run():
  """Rollout.routes is 0 where no token ran: the static engine wrote the experts of the
  padding it fed a finished row, the refill engine those of the last position's token, which
  the static engine never forwards; their Rollouts differed though their tokens were equal."""
  cfg = moe_config()
  params = perturbed_params(cfg)
  params["embed_tokens"]["embedding"] = params["embed_tokens"]["embedding"].at[1].multiply(4.0)
  static, refill = (rollout_of(cfg, params, decode_slots=k) for k in (0, 4))
  np.testing.assert_array_equal(static.completion_tokens, refill.completion_tokens)
  prompt_len = static.prompt_tokens.shape[1]
  done = ~np.asarray(static.completion_mask)
  assert done.sum() > 10  # rows that ended before the cap
  for rollout in (static, refill):
    ran = (np.asarray(rollout.routes)[:, prompt_len:] != 0).any(axis=(2, 3))
    assert not ran[done].any() and not ran[:, -1].any()
  np.testing.assert_array_equal(static.routes, refill.routes)


def test_replay_uses_exactly_the_rollout_experts():
  """Top-1 routing renormalised has weight 1 whatever the router's probabilities: replaying the
  rollout's experts under a different router gives the rollout model's log-probs bit for bit,
  while routing anew (routing_replay="off") under that router does not."""
  cfg = moe_config(experts_per_token=1)
  params = perturbed_params(cfg)
  rollout = rollout_of(cfg, params)
  reference, _, _, _ = policy_and_values(params, None, rollout, cfg, "none", 1.0)
  gate = params["layers"]["mlp"]["gate"]["kernel"]
  other = jax.tree.map(lambda x: x, params)
  other["layers"]["mlp"]["gate"]["kernel"] = jax.random.normal(jax.random.key(9), gate.shape)
  replayed, _, _, records = policy_and_values(other, None, rollout, cfg, "none", 1.0,
                                              routing_replay="rollout")
  anew, _, _, _ = policy_and_values(other, None, rollout, cfg, "none", 1.0)
  np.testing.assert_array_equal(replayed, reference)
  assert records["mismatched"] / records["routed"] > 0.3  # the other router disagrees
  mask = np.asarray(rollout.completion_mask)
  assert np.abs(np.asarray(anew) - np.asarray(reference))[mask].max() > 1e-2


def test_replay_narrows_the_gap_to_a_bfloat16_sampler():
  """A sampler in bfloat16 with a nearly indifferent router routes some tokens elsewhere than
  the float32 trainer: the mismatch is reported, and replaying the sampler's experts brings the
  trainer's log-probs closer to the sampler's."""
  cfg = moe_config()
  params = perturbed_params(cfg)
  params["layers"]["mlp"]["gate"]["kernel"] *= 0.02  # near-ties between the experts
  sampler_cfg = dataclasses.replace(cfg, compute_dtype="bfloat16")
  rollout = rollout_of(sampler_cfg, params, group=4, new_tokens=12)
  mask = np.asarray(rollout.completion_mask)
  gaps = {}
  for mode in ("off", "rollout"):
    logp, _, _, records = policy_and_values(params, None, rollout, cfg, "none", 1.0,
                                            routing_replay=mode)
    gaps[mode] = np.abs(np.asarray(logp) - np.asarray(rollout.logprobs))[mask].mean()
    mismatch = records["mismatched"] / records["routed"]
  assert mismatch > 0.01  # measured 0.0185
  assert gaps["rollout"] < 0.9 * gaps["off"], gaps  # measured 0.0196 against 0.0232


def test_load_balancing_loss_of_a_pass_counts_only_real_tokens():
  cfg = moe_config()
  params = perturbed_params(cfg)
  rollout = rollout_of(cfg, params)
  routing = teacher_forced_routing(cfg, params, rollout)
  mask = np.concatenate([np.asarray(rollout.prompt_mask), np.asarray(rollout.completion_mask)],
                        axis=1).reshape(-1)
  logits = np.asarray(routing["router_logits"])  # (L, B T, E)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  real = probs[:, mask]
  top2 = np.argsort(-real, axis=-1)[..., :2]
  counts = np.stack([(top2 == e).any(-1).mean() for e in range(4)])  # over layers x tokens
  expected = 4 * np.sum(counts * real.reshape(-1, 4).mean(0))
  _, _, _, records = policy_and_values(params, None, rollout, cfg, "none", 1.0)
  np.testing.assert_allclose(records["router_aux_loss"], expected, rtol=1e-5)
  np.testing.assert_allclose(load_balancing_loss(jnp.asarray(logits), 2, jnp.asarray(mask)),
                             expected, rtol=1e-5)


def test_a_tiny_moe_grpo_run_replays_its_routing(tmp_path):
  """Replay on, old log-probs recomputed: the update's log-probs equal them bit for bit (ratio
  exactly 1); the routing metrics are reported (with int8 rollouts and the update's own old
  log-probs: tests/test_quantized_rollout.py)."""
  replay, reuse = "rollout", False
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  config = small_tiny_config(steps=2, num_minibatches=1)
  config.model.update(dict(family="qwen3_moe", num_experts=4, experts_per_token=2,
                           moe_intermediate_size=32, norm_topk_prob=True))
  config.rl.routing_replay = replay
  config.rl.router_aux_coef = 0.01
  config.rl.reuse_old_logprobs = reuse
  records = []
  train(config, str(tmp_path), log=lambda *a: None, seeds=None)
  with open(tmp_path / "metrics.jsonl") as f:
    import json  # noqa: PLC0415
    records = [json.loads(line) for line in f if '"routing_mismatch"' in line]
  assert len(records) == 2
  for r in records:
    assert r["routing_mismatch"] == 0.0  # float32 sampler and trainer agree
    if not reuse:  # the old log-probs' pass and the update's, both on the rollout's routes
      assert r["ratio"] == 1.0 and r["clip_frac"] == 0.0
    assert 1.5 < r["router_aux_loss"] < 4.0  # k = 2 when perfectly balanced, E = 4 at worst
