"""On-policy distillation (grpo_jax/rl/distill.py): the per-token reward and the loss term
against NumPy, the teacher's checks (one sentence each), and both placements end to end on a
tiny teacher."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.errors import ConfigError
from grpo_jax.rl.distill import distilled_advantages, reverse_kl_per_token
from grpo_jax.rl.objective import make_objective


def _arrays(seed=0, rows=6, n=5):
  rng = np.random.default_rng(seed)
  mask = rng.random((rows, n)) < 0.75
  return (rng.normal(size=(rows, n)), rng.uniform(-3, 0, (rows, n)),
          rng.uniform(-3, 0, (rows, n)), mask)


def test_per_token_reward_against_numpy():
  adv, sampler, teacher, mask = _arrays()
  got = distilled_advantages(jnp.asarray(adv), jnp.asarray(sampler), jnp.asarray(teacher),
                             jnp.asarray(mask), 0.7)
  expected = np.where(mask, adv - 0.7 * (sampler - teacher), 0.0)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-6)
  kl = reverse_kl_per_token(jnp.asarray(sampler), jnp.asarray(teacher), jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(kl), np.where(mask, sampler - teacher, 0.0), atol=1e-6)


def test_loss_term_is_the_k3_estimate_to_the_teacher():
  """With rl.distill_in = "loss" the objective adds c * k3(log pi, log pi_T), token-mean."""
  adv, logp, teacher, mask = _arrays(1)
  args = (jnp.asarray(logp), jnp.asarray(logp), jnp.asarray(adv), jnp.asarray(mask),
          jnp.zeros(mask.shape))
  base = make_objective(rl_defaults(kl_coef=0.0))(*args, kl_coef=0.0)[0]
  loss, sums = make_objective(rl_defaults(kl_coef=0.0, distill_coef=0.3, distill_in="loss"))(
      *args, kl_coef=0.0, teacher_logp=jnp.asarray(teacher))
  d = logp - teacher
  k3 = np.minimum(np.exp(-d) + d - 1.0, 10.0)
  term = 0.3 * np.sum(np.where(mask, k3, 0.0)) / mask.sum()
  assert float(loss) - float(base) == pytest.approx(term, rel=1e-5)
  assert float(sums["distill_kl"]) / mask.sum() == pytest.approx(
      np.sum(np.where(mask, k3, 0.0)) / mask.sum(), rel=1e-5)


def _tiny_teacher(folder, vocab_size=16, seed=3):
  """A random 1-layer model of the tiny task's vocabulary as an HF folder (no tokenizer files:
  it reads the policy's ids)."""
  from grpo_jax.models.config import ModelConfig
  from grpo_jax.models.decoder import init_params
  from grpo_jax.models.hf_export import export_hf_checkpoint
  cfg = ModelConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=16)
  export_hf_checkpoint(init_params(cfg, jax.random.key(seed)), cfg, folder, model_type="llama")
  return str(folder)


def _student(teacher, steps=2, **rl):
  from tests.fixtures import small_tiny_config
  config = small_tiny_config(steps=steps, eval_every=steps, num_minibatches=1)
  config.rl.update(dict(distill_teacher=teacher, distill_coef=0.5, **rl))
  return config


@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_both_placements_run_and_report_the_reverse_kl(placement, tmp_path):
  from grpo_jax.train.stages.rl import train
  teacher = _tiny_teacher(tmp_path / "teacher")
  train(_student(teacher, distill_in=placement), str(tmp_path / "run"), log=lambda *a: None)
  with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
    steps = [r for r in map(json.loads, f) if "distill_reverse_kl" in r]
  assert len(steps) == 2 and all(math.isfinite(r["distill_reverse_kl"]) for r in steps)
  # A random teacher is far from the warmed-up student: a clearly positive reverse KL.
  assert steps[0]["distill_reverse_kl"] > 0.1
  assert ("distill_kl" in steps[0]) == (placement == "loss")


@pytest.mark.parametrize("fields, words", [
    (dict(distill_teacher="/nonexistent"), "rl.distill_teacher='/nonexistent' is not a Hugging"),
    (dict(distill_in="logits"), "rl.distill_in='logits'"),
    (dict(distill_in="loss", objective="drpo"), "use rl.distill_in='reward'"),
])
def test_bad_distillation_configs_are_one_sentence(fields, words, tmp_path):
  from grpo_jax.config import validate
  teacher = _tiny_teacher(tmp_path / "teacher")
  config = _student(teacher)
  config.rl.update(fields)
  with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
    validate(config)


def test_a_teacher_of_another_vocabulary_is_refused(tmp_path):
  from grpo_jax.train.run.reward_models import build_reward_sources
  from grpo_jax.train.run.sections import ModelSection, RewardSection  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task
  config = _student(_tiny_teacher(tmp_path / "teacher", vocab_size=40))
  with pytest.raises(ConfigError, match="vocab_size=40, the policy 16"):
    build_reward_sources(RewardSection.of(config), ModelSection.of(config), build_task(config))


@pytest.fixture
def served(tmp_path):
  """serve(folder) -> the URL of a grpo_jax.serve_teacher server for that folder (a thread)."""
  import threading  # noqa: PLC0415

  from grpo_jax.serve_teacher import Teacher, make_server  # noqa: PLC0415
  servers = []

  def serve(folder):
    server = make_server(Teacher(folder), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    return f"http://127.0.0.1:{server.server_address[1]}"
  yield serve
  for server in servers:
    server.shutdown()


def test_a_remote_teacher_gives_the_local_teachers_logprobs_and_run(served, tmp_path):
  """rl.distill_teacher = the URL of `python -m grpo_jax.serve_teacher`: the same per-token
  log-probs as the folder loaded in the run (within 1e-5: other padding), and a 2-step run with
  the same reverse KL to the teacher at each step."""
  from grpo_jax.train.run.reward_models import build_reward_sources  # noqa: PLC0415
  from grpo_jax.train.run.sections import ModelSection, RewardSection  # noqa: PLC0415
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  folder = _tiny_teacher(tmp_path / "teacher")
  url = served(folder)
  local_cfg, remote_cfg = _student(folder), _student(url)
  task = build_task(local_cfg)
  local, remote = (build_reward_sources(RewardSection.of(c), ModelSection.of(c), task).teacher
                   for c in (local_cfg, remote_cfg))
  prompts = task.train_batch(0, 3, 0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 16, (6, 7)).astype(np.int32)
  mask = np.arange(7)[None] < rng.integers(1, 8, (6, 1))
  np.testing.assert_allclose(remote.logprobs(prompts, tokens, mask, 2),
                             local.logprobs(prompts, tokens, mask, 2), atol=1e-5)
  kls = []
  for name, config in (("local", local_cfg), ("remote", remote_cfg)):
    train(config, str(tmp_path / name), log=lambda *a: None)
    with open(tmp_path / name / "metrics.jsonl") as f:
      kls.append([r["distill_reverse_kl"] for r in map(json.loads, f) if "distill_reverse_kl" in r])
  assert len(kls[0]) == 2
  np.testing.assert_allclose(kls[1], kls[0], atol=1e-5)


def test_a_remote_teacher_of_another_vocabulary_or_not_there_is_one_sentence(served, tmp_path):
  from grpo_jax.train.run.reward_models import build_reward_sources  # noqa: PLC0415
  from grpo_jax.train.run.sections import ModelSection, RewardSection  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  url = served(_tiny_teacher(tmp_path / "teacher", vocab_size=40))
  config = _student(url)
  with pytest.raises(ConfigError, match="has another tokenizer than the policy's"):
    build_reward_sources(RewardSection.of(config), ModelSection.of(config), build_task(config))
  config = _student("http://127.0.0.1:9")  # nothing listens on the discard port
  with pytest.raises(ConfigError, match="GET http://127.0.0.1:9/info failed"):
    build_reward_sources(RewardSection.of(config), ModelSection.of(config), build_task(config))
