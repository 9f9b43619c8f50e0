"""The real-model recipe's task and rewards (chat_arithmetic, number_answer), the prompt
bucketing every host run uses (data.prompt_bucket), and sample completions (samples.jsonl)."""

import json
import re

import numpy as np
import pytest

from grpo_jax.data.chat_arithmetic import ChatArithmeticTask, all_problems
from grpo_jax.data.task import bucketed_width, cut_prompts
from grpo_jax.data.tokenizer import pad_rows
from grpo_jax.rewards.number_answer import answer_scores, number_exact, number_shaped

# (completion, gold, exact, correct, format): read by hand.
CASES = [
    ("98", "98", True, True, True),
    (" 98.", "98", True, True, True),
    ("98\n", "98", True, True, True),
    ("47 + 51 = 98", "98", False, True, False),
    ("The answer is 98.", "98", False, True, False),
    ("97", "98", False, False, True),
    ("-3", "-3", True, True, True),
    ("1,234", "1234", False, True, False),
    ("98 apples", "98", False, True, False),
    ("98. 99", "98", False, False, False),
    ("", "98", False, False, False),
    ("To add them, we need", "98", False, False, False),
    ("098", "98", True, True, True),
    ("47 + 51 = 98.0", "98", False, True, False),  # a whole number with a decimal point
    ("The answer is 3.98", "98", False, False, False),  # not 98: its last number is 3.98
    ("1,234.50", "1234", False, False, False),
]


@pytest.mark.parametrize("completion,gold,exact,correct,fmt", CASES)
def test_answer_scores_by_hand(completion, gold, exact, correct, fmt):
  assert tuple(answer_scores(completion, gold)) == (exact, correct, fmt)


def _reference_shaped(completion, gold, format_score):
  """An independent reading of number_shaped's rule (module docstring)."""
  bare = re.fullmatch(r"\s*(-?\d+)\.?\s*", completion)
  numbers = re.findall(r"-?\d+(?:\.\d+)?", completion.replace(",", ""))
  if bare and int(bare.group(1)) == int(gold):
    return 1.0
  if numbers and float(numbers[-1]) == int(gold):
    return 0.5
  return format_score if bare else 0.0


@pytest.mark.parametrize("completion,gold,exact,correct,fmt", CASES)
def test_rewards_match_their_rules(completion, gold, exact, correct, fmt):
  assert number_shaped(completion, gold, 0.1) == _reference_shaped(completion, gold, 0.1)
  assert number_exact(completion, gold, 0.1) == (1.0 if exact else 0.1 if fmt else 0.0)


def test_problem_counts():
  assert len(all_problems(10, "+")) == 100
  assert len(all_problems(10, "-")) == 55  # a >= b
  assert len(all_problems(10, "+-*")) == 255


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  from tests.hf_fixtures import save_tiny_tokenizer  # noqa: PLC0415
  tokenizer = save_tiny_tokenizer(str(tmp_path_factory.mktemp("tok")))
  return ChatArithmeticTask(tokenizer, max_operand=20, operations="+-", test_size=50,
                            instruction="Answer with a single number.", use_chat_template=True,
                            max_prompt_tokens=96, max_new_tokens=8)


def test_split_is_disjoint_and_the_stream_pure(task):
  test = {u for _, _, u in task.test}
  train = [task.train_batch(p, 7, seed=3) for p in (0, 7, 14)]
  seen = {u for b in train for u in b.user_text}
  assert not test & seen
  assert len(task.train) + len(task.test) == len(all_problems(20, "+-"))
  again = task.train_batch(7, 7, seed=3)
  np.testing.assert_array_equal(again.prompt_tokens, train[1].prompt_tokens)
  assert again.gold == train[1].gold
  assert task.train_batch(0, 7, seed=4).user_text != train[0].user_text


def test_prompts_are_the_chat_template_and_golds_right(task):
  batch = task.test_batch(5)
  for row, user, gold in zip(range(5), batch.user_text, batch.gold):
    a, op, b = re.match(r"What is (\d+) ([+-]) (\d+)\?", user).groups()
    assert int(gold) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    want = task.tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                              tokenize=False, add_generation_prompt=True)
    ids = batch.prompt_tokens[row][batch.prompt_mask[row]].tolist()
    assert ids == task.tokenizer(want, add_special_tokens=False)["input_ids"]


def test_eval_scores_and_score(task):
  batch = task.test_batch(3)
  texts = [batch.gold[0], f"x = {batch.gold[1]}", "7777"]
  ids = [task.tokenizer(t, add_special_tokens=False)["input_ids"] + [task.eos_id] for t in texts]
  tokens, mask = pad_rows(ids, 12, task.pad_id, left=False)
  scores = task.eval_scores(batch, tokens, mask)
  np.testing.assert_array_equal(scores["eval_accuracy"], [1, 1, 0])
  np.testing.assert_array_equal(scores["eval_format"], [1, 0, 1])
  np.testing.assert_array_equal(scores["eval_strict"], [1, 0, 0])
  np.testing.assert_array_equal(task.score(batch, tokens, mask, 1), [1.0, 0.5, 0.0])


class _Characters:
  """A tokenizer of one id per character, without a chat template."""
  chat_template, eos_token_id, pad_token_id = None, 0, 0

  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": [ord(c) for c in text]}


def test_a_training_prompt_over_max_prompt_tokens_is_refused_when_the_task_is_built():
  """The one held-out problem is shorter than the longest training one ("99 + 99"): the check
  measures every prompt, not the held-out ones alone (a run used to stop in pad_rows)."""
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  held_out = ChatArithmeticTask(_Characters(), 100, "+", 1, "", False, 1000, 8).test
  longest = len("Question: What is 99 + 99?\nAnswer:")
  assert len(held_out[0][0]) < longest
  with pytest.raises(ConfigError, match=f"takes {longest} tokens, more than "
                     f"data.max_prompt_tokens={longest - 1}; raise it"):
    ChatArithmeticTask(_Characters(), 100, "+", 1, "", False, longest - 1, 8)
  task = ChatArithmeticTask(_Characters(), 100, "+", 1, "", False, longest, 8)
  assert task.train_batch(0, len(task.train), seed=0).prompt_tokens.shape[1] == longest


@pytest.mark.parametrize("lengths,width,bucket,want", [
    ([3, 5], 16, 4, 8), ([3, 8], 16, 4, 8), ([9], 16, 4, 12), ([15], 16, 8, 16),
    ([2], 16, 0, 16), ([1, 1], 16, 8, 8), ([16], 16, 5, 16)])
def test_bucketed_width(lengths, width, bucket, want):
  mask = np.zeros((len(lengths), width), bool)
  for i, n in enumerate(lengths):
    mask[i, width - n:] = True
  assert bucketed_width(mask, bucket) == want


def test_cut_prompts_keeps_every_token(task):
  batch = task.train_batch(0, 4, seed=0)
  width = bucketed_width(batch.prompt_mask, 8)
  cut = cut_prompts(batch, width)
  assert cut.prompt_tokens.shape == (4, width) and width % 8 == 0
  for full, short, m, ms in zip(batch.prompt_tokens, cut.prompt_tokens, batch.prompt_mask,
                                cut.prompt_mask):
    assert full[m].tolist() == short[ms].tolist()
  with pytest.raises(ValueError):
    cut_prompts(batch, int(batch.prompt_mask.sum(1).max()) - 1)


def test_cut_prompts_sample_the_same_tokens():
  """The sampler draws the same tokens, with log-probs within float rounding, from prompts
  with their left padding cut (what data.prompt_bucket does to every batch)."""
  import jax  # noqa: PLC0415

  from grpo_jax.models.config import ModelConfig  # noqa: PLC0415
  from grpo_jax.models.decoder import init_params  # noqa: PLC0415
  from grpo_jax.rollout.sampler import generate  # noqa: PLC0415
  cfg = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  params = init_params(cfg, jax.random.key(0))
  rows = [[5, 6, 7], [8, 9, 10, 11, 12], [4]]
  tokens, mask = pad_rows(rows, 24, 0, left=True)
  width = bucketed_width(mask, 8)
  out = [generate(params, t, m, jax.random.key(1), model_cfg=cfg, max_new_tokens=6,
                  temperature=1.0, eos_id=3, pad_id=0, group_size=2)
         for t, m in ((tokens, mask), (tokens[:, -width:], mask[:, -width:]))]
  np.testing.assert_array_equal(out[0].completion_tokens, out[1].completion_tokens)
  np.testing.assert_allclose(out[0].logprobs, out[1].logprobs, atol=1e-5)


def test_tiny_run_writes_samples(tmp_path):
  """samples.jsonl: training and evaluation samples at the evaluation steps, with text,
  reward and correctness; a few printed."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  from tests.tiny_runs import ROOT  # noqa: PLC0415
  out = subprocess.run(
      [sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
       f"--workdir={tmp_path}", "--config.warmup.steps=10", "--config.train.steps=2",
       "--config.train.eval_every=2", "--config.train.eval_size=20",
       "--config.train.eval_batch_size=20", "--config.rollout.num_prompts=4",
       "--config.train.num_samples=3", "--config.train.checkpoint_every=0"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
  assert [(s["step"], s["split"]) for s in samples] == (
      [(0, "eval")] * 3 + [(2, "train")] * 3 + [(2, "eval")] * 3)
  assert all(set(s) == {"step", "split", "prompt", "completion", "reward", "correct"}
             for s in samples)
  assert all(s["correct"] in (0.0, 1.0) for s in samples)
  assert "[eval]" in out.stdout and "[train]" in out.stdout
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert {"time_rollout_s", "time_reward_s", "time_update_s"} <= set(records[1])
