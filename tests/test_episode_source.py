"""Multi-turn episodes in the learner and the loop (grpo_jax/train/sources/episodes.py,
grpo_jax/data/env_task.py): the environment's tokens carry no loss, KL or entropy (the loss of a
two-turn episode equals the loss of its two assistant turns as single-turn rows), and the
calculator environment trains through `main` as a task of episodes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.models.decoder import init_params
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rl.aggregation import loss_normalizer
from grpo_jax.rollout.types import Rollout
from grpo_jax.train.learner.experience import RewardInputs, prepare_from_logprobs
from grpo_jax.train.learner.update import loss_and_sums
from tests.fixtures import tiny_model_config

PROMPT, TURN1, ENV, TURN2 = [3, 4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14], [15, 16, 17]


def _left(rows, width):
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, True
  return tokens, mask


def _right(rows, width):
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], mask[i, :len(r)] = r, True
  return tokens, mask


def _batch(rl, cfg, params, prompts, completions, actions, width):
  """A Batch through the learner's own preparation, from a Rollout whose sampler log-probs
  are the model's own minus 0.1 (ratios of e^0.1 reach the clip), its reference's minus 0.2,
  and one advantage of 0.7 on every token."""
  pt, pm = _left(prompts, max(map(len, prompts)))
  ct, cm = _right(completions, width)
  acts = np.zeros_like(cm)
  for i, a in enumerate(actions):
    acts[i, :len(a)] = a
  logp = completion_logprobs(params, cfg, pt, pm, ct, cm)[0]
  rollout = Rollout(pt, pm, ct, cm, jnp.where(cm, logp - 0.1, 0.0),
                    np.zeros(len(prompts), bool), acts)
  inputs = RewardInputs(jnp.ones(len(prompts)), {}, jnp.int32(1))
  batch, _ = prepare_from_logprobs(rl, 1, width, rollout, inputs,
                                   old_logp=jnp.where(cm, logp - 0.05, 0.0),
                                   ref_logp=jnp.where(cm, logp - 0.2, 0.0), old_values=None,
                                   kl_coef=rl.kl_coef)
  return batch._replace(advantages=jnp.where(cm, 0.7, 0.0))


def test_a_two_turn_episode_loses_what_its_two_assistant_turns_lose_alone():
  """Environment tokens in the sequence, masked out of the loss, the KL and the entropy: the
  episode's loss and gradient equal those of its two assistant turns as single-turn rows (the
  second with the first turn and the environment's reply in its prompt), token-mean."""
  cfg = tiny_model_config()
  params = init_params(cfg, jax.random.key(0))
  rl = rl_defaults(kl_coef=0.1, entropy_coef=0.01, reuse_old_logprobs=False, advantage="dr_grpo")
  episode = _batch(rl, cfg, params, [PROMPT], [TURN1 + ENV + TURN2],
                   [[True] * 4 + [False] * 3 + [True] * 3], 12)
  turns = _batch(rl, cfg, params, [PROMPT, PROMPT + TURN1 + ENV], [TURN1, TURN2],
                 [[True] * 4, [True] * 3], 4)
  assert int(episode.loss_mask.sum()) == int(turns.loss_mask.sum()) == 7

  def loss(p, b):
    return loss_and_sums((p, None), b, loss_normalizer(b.loss_mask, rl.loss_aggregation),
                         rl.kl_coef, model_cfg=cfg, rl=rl, temperature=1.0)[0]
  (l_episode, g_episode), (l_turns, g_turns) = (jax.value_and_grad(loss)(params, b)
                                                for b in (episode, turns))
  np.testing.assert_allclose(l_episode, l_turns, rtol=1e-6, atol=1e-7)
  for a, b in zip(jax.tree.leaves(g_episode), jax.tree.leaves(g_turns)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  # Without the action mask the environment's tokens would count: the gradient differs.
  g_unmasked = jax.grad(loss)(params, episode._replace(loss_mask=episode.completion_mask))
  gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g_unmasked),
                                                            jax.tree.leaves(g_turns)))
  assert gap > 1e-3, gap


def test_the_calculator_trains_as_episodes_through_main(tmp_path):
  """configs/grpo_calculator_tiny.py, cut to 2 steps: episodes of token ids (the policy's ids
  and the template's deltas), the environment's reward, episode metrics and whole-episode
  samples. (The same seed's episodes are identical whatever the tools' timing:
  tests/test_episodes.py.)"""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  c = grpo_calculator_tiny.get_config()
  c.warmup.steps, c.warmup.batch_size = 5, 8
  c.train.steps, c.train.eval_every, c.train.checkpoint_every = 2, 2, 0
  c.train.eval_size = c.train.eval_batch_size = 4
  c.rollout.num_prompts, c.rollout.group_size = 2, 4
  train(c, str(tmp_path), log=lambda *a, **k: None)
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in records] == [0, 1, 2]
  for key in ("turns_per_episode", "tool_calls_per_episode", "env_token_fraction",
              "reward_mean", "eval_accuracy", "eval_tool_calls_per_episode"):
    assert np.isfinite(records[-1][key]), key
  assert records[-1]["turns_per_episode"] >= 1
  assert 0 < records[-1]["env_token_fraction"] < 1  # the turn's end at least
  samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
  episode = next(s for s in samples if s["split"] == "train")
  assert "".join(t["text"] for t in episode["turns"]) == episode["completion"]
  assert any(t["trained"] for t in episode["turns"])


def test_an_env_task_refuses_the_host_source():
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.config import validate  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  c = grpo_calculator_tiny.get_config()
  c.train.experience_source = "host"
  with pytest.raises(ConfigError, match="train.experience_source='episodes'"):
    validate(c)


def test_warmup_demonstrations_are_the_episode_the_environment_accepts():
  """The warm-up's tool demonstration, decoded, is a call the parser reads, the tool's result
  and the right answer; the prompt is the environment's first messages."""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  c = grpo_calculator_tiny.get_config()
  c.task.warmup_tool_share = 1.0
  task = build_task(c)
  batch = task.warmup_batch(0, 4, 0)
  row = task.train_rows(0, 4, 1)[0]
  target = task.tokenizer.decode(batch.target_tokens[0][batch.target_mask[0]].tolist())
  product = row["a"] * row["b"]
  assert target == (f"[calculator(expression='{row['a']}*{row['b']}')]<|im_end|>\n"
                    f"<|im_start|>tool\n{product}<|im_end|>\n<|im_start|>assistant\n"
                    f"Answer: {product}<|im_end|>")
  prompt = task.tokenizer.decode(batch.prompt_tokens[0][batch.prompt_mask[0]].tolist())
  assert prompt.endswith(f"<|im_start|>user\n{row['a']}*{row['b']}<|im_end|>\n"
                         f"<|im_start|>assistant\n")
  # task.warmup_loss="assistant" (the recipe's): the loss on the policy's tokens only, as the
  # RL step's action mask; the tool's message and the next header are context.
  tokens, loss = batch.target_tokens[0], batch.loss_mask[0].astype(bool)
  assert task.tokenizer.decode(tokens[loss].tolist()) == (
      f"[calculator(expression='{row['a']}*{row['b']}')]<|im_end|>Answer: {product}<|im_end|>")
  assert task.tokenizer.decode(tokens[~loss & batch.target_mask[0]].tolist()) == (
      f"\n<|im_start|>tool\n{product}<|im_end|>\n<|im_start|>assistant\n")
  c.task.warmup_loss = "episode"
  assert build_task(c).warmup_batch(0, 4, 0).loss_mask is None


def test_no_held_out_problem_is_in_the_training_stream():
  """The calculator draws its splits from two seeds: at 3 digits 7 of the recipe's 64 held-out
  problems were among its 100,000 training rows. The task leaves them out; a split that is all
  held-out rows is refused before any compute."""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.data.env_task import held_out_left_out  # noqa: PLC0415
  from grpo_jax.envs.calculator import calculator_rows  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  task = build_task(grpo_calculator_tiny.get_config())
  pair = lambda row: (row["a"], row["b"])  # noqa: E731
  held_out = {pair(r) for r in task.test_batch(64).rows}
  drawn = {pair(r) for r in calculator_rows(100_000, 3, 0)}
  assert len(held_out & drawn) == 7  # what the environment's two seeds share
  assert not held_out & {pair(r) for r in task._train}  # noqa: SLF001
  assert len(task._train) == 100_000 - 7  # noqa: SLF001
  rows = [{"a": 1, "b": 2}, {"b": 3, "a": 4}]
  assert held_out_left_out(rows + [{"a": 5, "b": 6}], rows[::-1]) == [{"a": 5, "b": 6}]
  with pytest.raises(ConfigError, match="every one of the environment's 2 training rows"):
    held_out_left_out(rows, [{"a": 4, "b": 3}, {"a": 1, "b": 2}])
