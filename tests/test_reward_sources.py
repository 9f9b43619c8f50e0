"""Several rewards at once (grpo_jax/rewards/sources.py): the rule reward, a learned reward model
and remote servers weighted and combined (sum, or GDPO's normalise-then-sum) against NumPy;
per-reward metrics in a run; a remote server's faults through train.on_reward_error in a real
run (nothing else lost); GFPO's kept rows in the loop; the critic started from the reward model;
and the config errors."""

import json
import os
import types

import jax
import numpy as np
import pytest

from configs import grpo_tiny
from grpo_jax import config as config_lib
from grpo_jax.errors import ConfigError
from grpo_jax.models.reward_model import (export_reward_model, init_reward_model,
                                          load_reward_model, sequence_reward)
from grpo_jax.models.value_head import critic_from_reward_model
from grpo_jax.train.run.reward_models import build_reward_sources
from grpo_jax.errors import RewardError
from grpo_jax.train.run.sections import ModelSection, RewardSection
from grpo_jax.train.run.setup import build_model, build_task
from tests.fixtures import with_fields
from tests.test_remote_reward import _Box


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
  for name in ("no_proxy", "NO_PROXY"):
    monkeypatch.setenv(name, "127.0.0.1,localhost")


def _config(**fields):
  return with_fields(grpo_tiny.get_config(), fields)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
  """A random reward model of the tiny policy's shape (score head non-zero), exported."""
  directory = tmp_path_factory.mktemp("rm")
  cfg, _ = build_model(ModelSection.of(grpo_tiny.get_config()), jax.random.key(0))
  params = init_reward_model(cfg, jax.random.key(1))
  params["score"]["kernel"] = jax.random.normal(jax.random.key(2), (cfg.hidden_size, 1))
  export_reward_model(params, cfg, directory, "llama", pad_token_id=0)
  return directory


def _rollout(task, prompts, group, seed=0):
  rng = np.random.default_rng(seed)
  rows = prompts.prompt_tokens.shape[0] * group
  tokens = rng.integers(3, len(task.tokenizer), (rows, task.max_new_tokens)).astype(np.int32)
  lengths = rng.integers(1, task.max_new_tokens + 1, rows)
  mask = np.arange(task.max_new_tokens)[None] < lengths[:, None]
  tokens[np.arange(rows), lengths - 1] = task.eos_id
  tokens = np.where(mask, tokens, 0)
  # a quarter of the rows the right answer, so the rule reward varies
  right = np.repeat(prompts.target_tokens, group, 0)
  pick = rng.random(rows) < 0.25
  return np.where(pick[:, None], right, tokens), np.where(pick[:, None],
                                                          np.repeat(prompts.target_mask, group, 0),
                                                          mask)


@pytest.mark.parametrize("combine", ["sum", "normalise_then_sum"])
def test_rule_and_reward_model_weighted_against_numpy(rm_dir, combine):
  config = _config(**{"reward.rule_weight": 2.0, "reward.combine": combine})
  config.reward.models = [dict(path=str(rm_dir), weight=0.5, name="rm")]
  config_lib.validate(config)
  task = build_task(config)
  sources = build_reward_sources(RewardSection.of(config), ModelSection.of(config), task)
  assert sources.names == ("exact_match", "rm") and sources.models[0].tokenizer is None
  prompts, group = task.train_batch(0, 6, 0), 4
  tokens, mask = _rollout(task, prompts, group)
  rewards, failed, parts = sources.score(task, prompts, tokens, mask, group, "raise")
  rule = task.score(prompts, tokens, mask, group)
  cfg, params, _ = load_reward_model(rm_dir)
  rm = np.asarray(sequence_reward(params, cfg, np.repeat(prompts.prompt_tokens, group, 0),
                                  np.repeat(prompts.prompt_mask, group, 0), tokens, mask))
  np.testing.assert_array_equal(parts["exact_match"], rule)
  np.testing.assert_allclose(parts["rm"], rm, atol=1e-5)
  if combine == "sum":
    expected = 2.0 * rule + 0.5 * rm
  else:
    def norm(x):
      g = x.reshape(-1, group)
      mean, std = g.mean(1, keepdims=True), g.std(1, ddof=1, keepdims=True)
      return ((g - mean) / (std + 1e-6)).reshape(-1)
    expected = 2.0 * norm(rule) + 0.5 * norm(rm)
  np.testing.assert_allclose(rewards, expected, atol=1e-4)
  assert not failed.any() and 0 < rule.mean() < 1


def test_per_reward_metrics_and_the_critic_from_the_reward_model(rm_dir, tmp_path):
  from grpo_jax.train.stages.rl import train
  config = _config(**{"warmup.steps": 20, "train.steps": 2, "train.eval_every": 2,
                      "train.eval_size": 40, "train.eval_batch_size": 40,
                      "rollout.num_prompts": 4, "rollout.group_size": 4,
                      "rl.value_head": "separate", "rl.critic_init": "reward_model",
                      "train.checkpoint_every": 0})
  config.reward.models = [dict(path=str(rm_dir), weight=1.0, name="rm")]
  state = train(config, str(tmp_path), log=lambda *a: None)
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert {"reward/exact_match_mean", "reward/rm_mean", "value_loss"} <= set(records[1])
  cfg, params, _ = load_reward_model(rm_dir)
  critic = critic_from_reward_model(params, cfg, cfg)
  np.testing.assert_array_equal(critic["head"]["kernel"], params["score"]["kernel"])
  assert state.train.value_params["backbone"].keys() == critic["backbone"].keys()


def test_a_critic_from_a_reward_model_of_other_maths_is_refused():
  """Only the sizes, family and q/k options were compared: a reward model with another RoPE
  base, norm epsilon or window became a critic that computed another function of the same
  weights (values 3.55 where the reward model scored 0.96). Dtypes and memory settings may
  differ."""
  import dataclasses  # noqa: PLC0415

  from grpo_jax.config import ConfigError  # noqa: PLC0415
  from grpo_jax.models.reward_model import init_reward_model  # noqa: PLC0415
  from tests.fixtures import tiny_model_config  # noqa: PLC0415
  cfg = tiny_model_config()
  params = init_reward_model(cfg, jax.random.key(0))
  for change in (dict(rope_theta=5e5), dict(rms_norm_eps=1e-2), dict(sliding_window=2)):
    field = next(iter(change))
    with pytest.raises(ConfigError, match=f"architecture, but it has {field}="):
      critic_from_reward_model(params, dataclasses.replace(cfg, **change), cfg)
  critic_from_reward_model(params, dataclasses.replace(cfg, remat="full", logits_chunk=4), cfg)


def _remote_run(tmp_path, url, on_error, steps=3):
  from grpo_jax.train.stages.rl import train
  config = _config(**{"warmup.steps": 20, "train.steps": steps, "train.eval_every": steps,
                      "train.eval_size": 40, "train.eval_batch_size": 40,
                      "rollout.num_prompts": 4, "rollout.group_size": 4,
                      "train.checkpoint_every": 1, "train.on_reward_error": on_error,
                      "train.max_reward_error_fraction": 1.0})
  config.reward.remote = [dict(url=url, name="judge", weight=1.0, batch_size=8, max_retries=0,
                               timeout_s=5.0)]
  return train(config, str(tmp_path), log=lambda *a: None)


def test_remote_faults_are_counted_and_nothing_else_is_lost(tmp_path):
  # the second chunk of every step fails (HTTP 500); the first is scored by the answer's length
  box = _Box(lambda body, n: (500, {"error": "down"}) if n % 2 else
             (200, {"rewards": [float(len(q)) for q in body["queries"]]}))
  try:
    state = _remote_run(tmp_path / "zero", box.url, "zero")
    with open(tmp_path / "zero" / "metrics.jsonl") as f:
      records = [json.loads(line) for line in f]
    assert [r["reward_errors"] for r in records[1:]] == [8, 8, 8]
    assert all("reward/judge_mean" in r for r in records[1:])
    assert int(state.step) == 3
    assert sorted(os.listdir(tmp_path / "zero" / "checkpoints"))[-1] == "3"
    with pytest.raises(RewardError) as error:
      _remote_run(tmp_path / "raise", box.url, "raise", steps=1)
    message = str(error.value)
    assert "\n" not in message and box.url in message and "HTTP 500" in message
  finally:
    box.close()


def test_the_rule_reward_alone_is_normalised_under_normalise_then_sum():
  """Weight 1.0 and 1.0001 give the same normalised rewards (the unweighted rule alone is
  summed as it is only under reward.combine='sum')."""
  from grpo_jax.rewards.sources import RewardSources  # noqa: PLC0415

  class Task:
    tokenizer = None

    def score(self, prompts, tokens, mask, group_size):
      return mask.sum(1).astype(np.float32)

  prompts = types.SimpleNamespace(prompt_tokens=np.zeros((2, 2), np.int32),
                                  prompt_mask=np.ones((2, 2), bool))
  mask = np.arange(4)[None] < np.array([4, 2, 1, 3, 1, 1, 2, 4])[:, None]
  tokens = np.zeros((8, 4), np.int32)
  got = {w: RewardSources(rule_weight=w, combine="normalise_then_sum").score(
      Task(), prompts, tokens, mask, 4, "raise")[0] for w in (1.0, 1.0001)}
  np.testing.assert_allclose(got[1.0], got[1.0001] / 1.0001, rtol=1e-5)
  np.testing.assert_allclose(got[1.0].reshape(2, 4).mean(1), 0.0, atol=1e-6)
  raw = RewardSources(combine="sum").score(Task(), prompts, tokens, mask, 4, "raise")[0]
  np.testing.assert_array_equal(raw, [4, 2, 1, 3, 1, 1, 2, 4])


def test_gfpo_keeps_the_shortest_rows_of_each_group():
  from grpo_jax.train.sources.collect import gfpo_rows
  config = _config(**{"rollout.group_size": 6, "rl.gfpo_keep": 2})
  lengths = np.array([5, 1, 3, 2, 2, 4, 1, 1, 6, 6, 6, 6])
  mask = np.arange(8)[None] < lengths[:, None]
  rows = gfpo_rows(config.rl, np.zeros(12, np.float32), mask, 6)
  np.testing.assert_array_equal(rows, [1, 3, 6, 7])


def test_gfpo_run_updates_on_the_kept_rows(tmp_path):
  from grpo_jax.train.stages.rl import train
  config = _config(**{"warmup.steps": 20, "train.steps": 2, "train.eval_every": 2,
                      "train.eval_size": 40, "train.eval_batch_size": 40,
                      "rollout.num_prompts": 4, "rollout.group_size": 6, "rl.gfpo_keep": 3,
                      "train.checkpoint_every": 0})
  train(config, str(tmp_path), log=lambda *a: None)
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 3 and np.isfinite(records[-1]["loss"])


@pytest.mark.parametrize("fields, models, message", [
    ({"reward.rule_weight": 0.0}, None, "leaves no reward"),
    ({"reward.combine": "mean"}, None, "reward.combine='mean' is unknown"),
    ({}, [dict(weight=1.0)], "reward.models[0] has no path"),
    ({}, [dict(path="x", colour=1)], "unknown field(s) ['colour']"),
    ({}, ["/ckpt/rm"], "reward.models[0]='/ckpt/rm' is not an entry of fields; give a dict"),
    ({"reward.remote": [dict(name="judge")]}, None, "reward.remote[0] has no url"),
    ({"reward.remote": ["http://127.0.0.1:1/score"]}, None, "reward.remote[0]='http://"),
    ({"reward.remote": [dict(url="http://127.0.0.1:1/score", headers=None)]}, None,
     "reward.remote[0].headers is a NoneType"),
    ({"reward.rule_weight": float("nan")}, None,
     "reward.rule_weight=nan is not a finite number; give the reward's weight as a real number"),
    ({}, [dict(path="x", weight="1,5")], "reward.models[0].weight='1,5' is not a finite number"),
    ({}, [dict(path="x", max_tokens=0)], "reward.models[0].max_tokens=0; give the number of"),
    ({}, [dict(path="x", max_tokens=-3)], "reward.models[0].max_tokens=-3; give the number of"),
    ({"rl.critic_init": "reward_model", "rl.value_head": "separate"}, None,
     "reward.models is empty"),
    ({"rl.critic_init": "reward_model"}, [dict(path="x")], "set rl.value_head='separate'"),
    ({"rl.gfpo_keep": 9}, None, "rl.gfpo_keep=9"),
    ({"rl.gfpo_keep": 2, "rl.gfpo_metric": "speed"}, None, "rl.gfpo_metric='speed'"),
    ({"rl.advantage": "remax", "reward.combine": "normalise_then_sum"}, None,  # greedy: G = 1
     "rl.advantage='remax' needs greedy_rewards, which reward.combine='normalise_then_sum'"),
    ({"train.fused_steps": 1, "reward.combine": "normalise_then_sum"}, None,
     "reward.combine and GFPO run on the host"),
    ({"reward.combine": "normalise_then_sum", "rollout.group_size": 1, "rl.advantage": "gae",
      "rl.value_head": "shared"}, None, "rollout.group_size=1 has no group standard deviation"),
])
def test_config_errors(fields, models, message):
  config = _config(**fields)
  if models is not None:
    config.reward.models = models
  with pytest.raises(ConfigError, match=None) as error:
    config_lib.validate(config)
  assert message in str(error.value)


@pytest.mark.parametrize("weight", [float("nan"), float("-inf"), "1,5", None, True])
def test_reward_sources_built_in_python_refuse_a_weight_the_config_refuses(weight):
  """RewardSources(rule_weight=nan) was built and scored every completion NaN; now its
  constructor refuses a weight that is not a finite number in the config path's sentence (the
  rule's, and a source's: reward.models[i].weight, reward.remote[i].weight)."""
  from grpo_jax.rewards.sources import (RemoteSource, RewardModelSource,  # noqa: PLC0415
                                        RewardSources)
  sentence = ("reward.{}={!r} is not a finite number; give the reward's weight as a real "
              "number, e.g. 1.0.")
  with pytest.raises(ConfigError) as built:
    RewardSources(rule_weight=weight)
  assert str(built.value) == sentence.format("rule_weight", weight)
  if isinstance(weight, float):  # (the config's rule_weight takes floats only)
    with pytest.raises(ConfigError) as from_config:
      config_lib.validate(_config(**{"reward.rule_weight": weight}))
    assert str(from_config.value) == str(built.value)
  config = _config()
  config.reward.models = [dict(path="x", weight=weight)]
  with pytest.raises(ConfigError) as from_config:
    config_lib.validate(config)
  with pytest.raises(ConfigError) as built:
    RewardSources(models=(RewardModelSource("rm0", weight, None, None, None),))
  assert str(built.value) == str(from_config.value) == sentence.format("models[0].weight",
                                                                       weight)
  with pytest.raises(ConfigError, match=r"^reward.remote\[1\].weight="):
    RewardSources(remote=(RemoteSource("a", 1.0, None), RemoteSource("b", weight, None)))
  assert RewardSources(rule_weight=0.5).rule_weight == 0.5


def test_remote_config_errors_name_the_field():
  config = _config()
  config.reward.remote = [dict(url="ftp://x")]
  with pytest.raises(ConfigError) as error:
    config_lib.validate(config)
  assert "reward.remote[0]" in str(error.value)
  config.reward.remote = [dict(url="http://127.0.0.1:1/score", weight=float("inf"))]
  with pytest.raises(ConfigError, match=r"^reward.remote\[0\].weight=inf is not a finite"):
    config_lib.validate(config)


def test_a_reward_named_like_the_rule_reward_is_one_sentence():
  """A remote reward named like the task's rule reward would overwrite its column."""
  config = _config(**{"warmup.steps": 0})
  config.reward.remote = [dict(url="http://127.0.0.1:1/score", name="exact_match")]
  task = types.SimpleNamespace(reward=types.SimpleNamespace(name="exact_match"))
  with pytest.raises(ConfigError, match=r"^reward.remote\[0\].name='exact_match' is also the "
                     r"name of the task's rule reward \(reward.rule_weight > 0\), whose scores"):
    build_reward_sources(RewardSection.of(config), None, task)
  config.reward.rule_weight = 0.0  # no rule column: the name is free
  assert build_reward_sources(RewardSection.of(config), None, task).names == ("exact_match",)


def test_the_rule_reward_is_named_as_docs_rewards_md_says():
  """Its column and metric reward/<name>_mean: GSM8K's Python function name (existing recipes'
  key), the table task's `table` (the class name TableTask before); messages about a table task
  name its reward.fns."""
  import grpo_jax.rewards.gsm8k  # noqa: F401, PLC0415  (registers the gsm8k rewards)
  from grpo_jax.data.gsm8k import GSM8KTask  # noqa: PLC0415
  from grpo_jax.data.table import TableTask  # noqa: PLC0415
  from grpo_jax.errors import RewardContractError  # noqa: PLC0415
  from grpo_jax.rewards import guard  # noqa: PLC0415
  from grpo_jax.rewards.functions import RewardFunction  # noqa: PLC0415
  from grpo_jax.rewards.registry import get_reward  # noqa: PLC0415
  gsm8k = object.__new__(GSM8KTask)
  gsm8k.reward_fn = get_reward("gsm8k_strict", "text", "gsm8k").fn  # as from_config sets it
  table = object.__new__(TableTask)
  table.rewards = (RewardFunction("my_rewards.py:score", len, 1.0),)
  names = {"gsm8k": guard.reward_name(gsm8k), "table": guard.reward_name(table)}
  assert names == {"gsm8k": "strict_reward", "table": "table"}
  with open(os.path.join(os.path.dirname(__file__), "..", "docs", "rewards.md")) as f:
    docs = f.read()
  assert all(f"`reward/{n}_mean`" in docs for n in names.values())
  with pytest.raises(RewardContractError, match=r"^the reward function "
                     r"reward.fns='my_rewards.py:score' returned None for 3 completions"):
    guard._check_reward_shape(table, None, 3)
  with pytest.raises(RewardContractError, match=r"^the reward function 'strict_reward' returned"):
    guard._check_reward_shape(gsm8k, None, 3)


def test_process_reward_model_gives_the_process_estimator_its_step_rewards(tmp_path):
  """reward.process_model: a causal LM sharing the policy's tokenizer scores each step (here a
  step ends at each digit '1' and at the last token) and rl.advantage='process' trains on it."""
  from grpo_jax.models.decoder import init_params
  from grpo_jax.models.hf_export import export_hf_checkpoint
  from grpo_jax.train.run.reward_models import build_reward_sources
  from grpo_jax.train.sources.collect import score_round
  from grpo_jax.train.stages.rl import train
  config = _config(**{"warmup.steps": 20, "train.steps": 2, "train.eval_every": 2,
                      "train.eval_size": 40, "train.eval_batch_size": 40,
                      "rollout.num_prompts": 4, "rollout.group_size": 4,
                      "rl.advantage": "process", "train.checkpoint_every": 0})
  cfg, _ = build_model(ModelSection.of(config), jax.random.key(0))
  export_hf_checkpoint(init_params(cfg, jax.random.key(7)), cfg, tmp_path / "prm",
                       model_type="llama")
  task = build_task(config)
  one = task.tokenizer.encode("1")[0]
  config.reward.process_model.update(dict(path=str(tmp_path / "prm"), separator_id=one,
                                           good_id=5, bad_id=6, max_steps=3))
  config_lib.validate(config)
  sources = build_reward_sources(RewardSection.of(config), ModelSection.of(config), task)
  prompts = task.train_batch(0, 4, 0)
  tokens, mask = _rollout(task, prompts, 4)
  from grpo_jax.rollout.types import Rollout
  rollout = Rollout(np.repeat(prompts.prompt_tokens, 4, 0), np.repeat(prompts.prompt_mask, 4, 0),
                    tokens, mask, np.zeros(tokens.shape, np.float32), np.zeros(16, bool), mask)
  _, extras, _, _, _ = score_round(task, prompts, rollout, None, 4, "raise", ("step_rewards",),
                                sources)
  rewards, ends, step_mask = extras["step_rewards"]
  for row in range(16):
    expect = [t for t in range(tokens.shape[1]) if mask[row, t] and tokens[row, t] == one]
    last = int(np.flatnonzero(mask[row])[-1])
    expect = expect + ([last] if last not in expect else [])
    expect = expect if len(expect) <= 3 else expect[:2] + expect[-1:]
    np.testing.assert_array_equal(ends[row][step_mask[row]], expect)
    assert np.all((rewards[row][step_mask[row]] > 0) & (rewards[row][step_mask[row]] < 1))
  train(config, str(tmp_path / "run"), log=lambda *a: None)


def test_a_missing_reward_model_is_one_sentence_before_the_workdir_is_touched(tmp_path):
  from grpo_jax.errors import InputError
  from grpo_jax.train.stages.rl import train
  config = _config(**{"warmup.steps": 1})
  config.reward.models = [dict(path=str(tmp_path / "no_rm"))]
  with pytest.raises(InputError) as error:
    train(config, str(tmp_path / "run"), log=lambda *a: None)
  assert "no_rm" in str(error.value) and "\n" not in str(error.value)
  assert not (tmp_path / "run").exists()
