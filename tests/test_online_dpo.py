"""Online DPO (grpo_jax/rl/online_dpo.py): the pair selection against a loop, the loss against
the offline DPO loss of grpo_jax/rl/dpo.py on the selected pairs, the objective's checks, and
the switch end to end (main with rl.objective = "online_dpo")."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.errors import ConfigError
from grpo_jax.rl.dpo import PairLogps, dpo
from grpo_jax.rl.objective import make_objective
from grpo_jax.rl.online_dpo import best_and_worst, online_dpo_loss

G = 4


def _loop_pairs(rewards, group_size):
  """Per group: (first row of the maximum, first row of the minimum) or None on a tie."""
  out = []
  for q in range(len(rewards) // group_size):
    r = [float(x) for x in rewards[q * group_size:(q + 1) * group_size]]
    hi, lo = max(r), min(r)
    out.append(None if hi == lo else (q * group_size + r.index(hi), q * group_size + r.index(lo)))
  return out


def test_pairs_are_the_best_and_the_worst_ties_skipped():
  rng = np.random.default_rng(0)
  for trial in range(20):
    rewards = rng.choice([0.0, 0.1, 1.0], size=8 * G)  # many ties within and across groups
    rewards[:G] = 0.5  # one group all equal
    chosen, rejected, has_pair = (np.asarray(x) for x in best_and_worst(jnp.asarray(rewards), G))
    expected = _loop_pairs(rewards, G)
    assert [None if not h else (int(c), int(r)) for c, r, h in
            zip(chosen, rejected, has_pair)] == expected


def test_loss_is_offline_dpo_on_the_selected_pairs():
  rng = np.random.default_rng(1)
  rows, n = 6 * G, 5
  mask = rng.random((rows, n)) < 0.8
  logp, ref = rng.uniform(-3, 0, (rows, n)), rng.uniform(-3, 0, (rows, n))
  rewards = rng.choice([0.0, 1.0], size=rows)
  rewards[G:2 * G] = 1.0  # a tie
  loss, m = online_dpo_loss(jnp.asarray(logp), jnp.asarray(ref), jnp.asarray(rewards),
                            jnp.asarray(mask), G, 0.3)
  pairs = [p for p in _loop_pairs(rewards, G) if p is not None]
  s, r = (np.where(mask, logp, 0).sum(1), np.where(mask, ref, 0).sum(1))
  c, w = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
  offline = dpo(PairLogps(jnp.asarray(s[c]), jnp.asarray(s[w]), None, None, jnp.asarray(r[c]),
                          jnp.asarray(r[w])), beta=0.3)
  assert float(loss) == pytest.approx(float(offline), rel=1e-6)
  delta = (s[c] - r[c]) - (s[w] - r[w])
  numpy_loss = np.mean(np.log1p(np.exp(-0.3 * delta)))
  assert float(loss) == pytest.approx(numpy_loss, rel=1e-5)
  assert float(m["pairs"]) == len(pairs)
  assert float(m["reward_margin"]) == pytest.approx(np.mean(0.3 * delta), rel=1e-5)


def test_no_pair_no_loss():
  loss, m = online_dpo_loss(jnp.zeros((G, 3)), jnp.ones((G, 3)), jnp.ones(G),
                            jnp.ones((G, 3), bool), G, 0.1)
  assert float(loss) == 0.0 and float(m["pairs"]) == 0.0


@pytest.mark.parametrize("bad, words", [(dict(kl_coef=0.0), "kl_coef=0.0"),
                                        (dict(kl_in="reward"), "kl_in='loss'"),
                                        (dict(num_micro_batches=2), "num_micro_batches=2"),
                                        (dict(value_head="shared"), "value_head")])
def test_settings_it_cannot_serve_are_one_sentence(bad, words):
  with pytest.raises(ConfigError, match=words):
    make_objective(rl_defaults(objective="online_dpo", **{"kl_coef": 0.1, **bad}), G)
  with pytest.raises(ConfigError, match="group_size=1"):
    make_objective(rl_defaults(objective="online_dpo", kl_coef=0.1), 1)


def test_the_switch_runs_end_to_end(tmp_path):
  from grpo_jax.train.stages.rl import train
  from tests.fixtures import small_tiny_config
  config = small_tiny_config(steps=2, eval_every=2, num_minibatches=1)
  config.rl.update(dict(objective="online_dpo", kl_coef=0.1))
  train(config, str(tmp_path), log=lambda *a: None)
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  steps = [r for r in records if "online_dpo_pairs" in r]
  assert len(steps) == 2 and "eval_accuracy" in records[-1]
  # This barely warmed-up policy scores every sample 0: no group has a pair, so no loss (the
  # loss on pairs is tested above against the offline DPO loss).
  assert all(r["online_dpo_pairs"] == 0 and r["loss"] == 0.0 for r in steps)
  assert all(r["frac_groups_all_same"] == 1.0 for r in steps)
