"""Scoring that survives a broken reward function: `guarded_score` calls a task's reward and,
when it raises, returns the wrong shape or non-finite values, finds the completions at fault
and stops with a RewardError showing one (train.on_reward_error="raise") or scores them 0 and
marks them ("zero")."""

from __future__ import annotations

import numpy as np

from grpo_jax.errors import RewardError
from grpo_jax.prompt_batch import take_rows


def _text(tokenizer, tokens, mask, limit: int = 300) -> str:
  text = tokenizer.decode(np.asarray(tokens)[np.asarray(mask, bool)].tolist())
  return text if len(text) <= limit else text[:limit] + "..."


def _score_rows(task, prompts, tokens, mask, group_size: int):
  """Scores each completion alone: (rewards, {row: (what went wrong, exception or None)})."""
  rewards, failures = [], {}
  for row in range(tokens.shape[0]):
    one = take_rows(prompts, np.array([row // group_size]))
    try:
      r = float(np.asarray(task.score(one, tokens[row:row + 1], mask[row:row + 1], 1))[0])
      if not np.isfinite(r):
        failures[row] = (f"returned {r}", None)
    except Exception as e:  # noqa: BLE001  a user's reward function may raise anything
      r, failures[row] = None, (f"raised {type(e).__name__}: {e}", e)
    rewards.append(0.0 if row in failures else r)
  return np.asarray(rewards, np.float32), failures


def reward_name(task) -> str:
  """The name of the reward function a task scores with, for messages."""
  reward = getattr(task, "reward", None)
  name = getattr(reward, "name", None) or getattr(getattr(task, "reward_fn", None), "__name__",
                                                  None)
  return name or type(task).__name__


def _check_reward_shape(task, rewards, rows: int) -> None:
  """One number per completion, or a RewardError naming the reward and the expected shape (a
  bug of the reward function, whatever train.on_reward_error says)."""
  if rewards is not None:
    try:
      shape = np.shape(np.asarray(rewards, np.float64))
    except (TypeError, ValueError):
      shape = "not numeric"
    if shape == (rows,):
      return
  got = "None" if rewards is None else (
      f"values of shape {shape}" if isinstance(shape, tuple) else "values that are not numbers")
  raise RewardError(f"the reward function {reward_name(task)!r} returned {got} for {rows} "
                    f"completions; it must return one finite number per completion, shape "
                    f"({rows},).")


def guarded_score(task, prompts, tokens, mask, group_size: int, on_error: str):
  """task.score(prompts, tokens, mask, group_size) -> (rewards, failed (B,) bool).

  A completion whose reward raises or is not finite stops the run with a RewardError showing
  its prompt and completion (on_error="raise"), or is scored 0 and marked failed
  (on_error="zero"; the caller counts them and zeroes what else it scores for those rows).
  """
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  try:
    rewards = task.score(prompts, tokens, mask, group_size)
  except Exception as e:  # noqa: BLE001
    ok, first_error = None, e
  else:
    _check_reward_shape(task, rewards, tokens.shape[0])
    ok, first_error = np.isfinite(np.asarray(rewards, np.float64)), None
  if ok is not None and ok.all():
    return np.asarray(rewards, np.float32), np.zeros(tokens.shape[0], bool)
  rewards, failures = _score_rows(task, prompts, tokens, mask, group_size)
  if not failures:  # the batch failed but every completion scores alone: a batch-level bug
    what = repr(first_error) if first_error is not None else "non-finite values"
    raise RewardError(f"the reward function failed on the whole batch ({what}) but on no "
                      f"completion alone; fix its batch handling.") from first_error
  if on_error == "raise":
    row, (what, error) = min(failures.items())
    one = take_rows(prompts, np.array([row // group_size]))
    prompt = _text(task.tokenizer, one.prompt_tokens[0], one.prompt_mask[0])
    raise RewardError(
        f"the reward function {what} for the prompt {prompt!r} and the completion "
        f"{_text(task.tokenizer, tokens[row], mask[row])!r}; fix the reward function, or set "
        f"train.on_reward_error='zero' to score such completions 0 and count them.") from error
  return rewards, np.isin(np.arange(tokens.shape[0]), list(failures))
