"""Scoring that survives a broken reward function: `guarded_score` calls a task's reward and,
when it raises, returns the wrong shape or non-finite values, finds the completions at fault
and stops with a RewardError showing one (train.on_reward_error="raise") or scores them 0 and
marks them ("zero")."""

from __future__ import annotations

import numpy as np

from grpo_jax.errors import RewardContractError, RewardError, RunStopped
from grpo_jax.rewards.functions import RewardCountError
from grpo_jax.prompt_batch import take_rows


def _text(tokenizer, tokens, mask, limit: int = 300) -> str:
  text = tokenizer.decode(np.asarray(tokens)[np.asarray(mask, bool)].tolist())
  return text if len(text) <= limit else text[:limit] + "..."


def _refuse_wrong_count(error: Exception, scoring: str, rows: int) -> None:
  """A reward function that returned the wrong number of values for the whole batch (call_reward's
  shared check) is the user's bug, whether the completions score alone or not: one sentence
  naming the function, the counts and the scoring, exit 2 (RewardContractError)."""
  if isinstance(error, RewardCountError):
    raise RewardContractError(
        f"{str(error).split(';')[0]}, at the {scoring} scoring (a batch of {rows}); fix it to "
        f"return one float per completion, whatever their number.") from None


def _score_rows(task, prompts, tokens, mask, group_size: int):
  """Scores each completion alone: (rewards, {row: (what went wrong, exception or None)})."""
  rewards, failures = [], {}
  for row in range(tokens.shape[0]):
    one = take_rows(prompts, np.array([row // group_size]))
    try:
      r = float(np.asarray(task.score(one, tokens[row:row + 1], mask[row:row + 1], 1))[0])
      if not _finite_in_float32(r):
        failures[row] = (f"the reward function returned {r}", None)
    except RunStopped:  # a time limit: scoring the rows one by one would wait again
      raise
    except Exception as e:  # noqa: BLE001  a user's reward function may raise anything
      r, failures[row] = None, (_what_failed(e), e)
    rewards.append(0.0 if row in failures else r)
  return np.asarray(rewards, np.float32), failures


def _finite_in_float32(values):
  """Whether each value is finite in float32, the dtype the run learns in (1e39 is inf there)."""
  with np.errstate(over="ignore"):
    return np.isfinite(np.asarray(values, np.float64).astype(np.float32))


def _what_failed(error: Exception) -> str:
  """`reward function 'm:f' returned None` (an error of rewards/functions.py, which names the
  function; its fix, after the ';', is the caller's), else `the reward function raised Type:
  message`."""
  text = str(error)
  if not text.startswith("reward function '"):
    return f"the reward function raised {type(error).__name__}: {error}"
  # (what the function itself raised is kept whole; a fix of functions.py's own is dropped)
  return text if "' raised " in text else text.split(";")[0].rstrip(".")


def reward_name(task) -> str:
  """The name of the task's rule reward: its column and its metric `reward/<name>_mean` beside
  other reward sources (train/run/reward_models.py; messages name it by _reward_label). A
  registered "tokens" reward's registered name (addition, visual: `exact_match`); else the
  Python name of the "text" reward function (GSM8K: `strict_reward` for
  reward.name='gsm8k_strict'); else the task's own `name` (table: `table`, the weighted sum of
  its reward.fns; the class name `TableTask` before); else the class name."""
  reward = getattr(task, "reward", None)
  name = getattr(reward, "name", None) or getattr(getattr(task, "reward_fn", None), "__name__",
                                                  None)
  own = getattr(type(task), "name", None)
  return name or (own if isinstance(own, str) and own else type(task).__name__)


def _reward_label(task) -> str:
  """How messages name what scores a task: its reward_name quoted, or for a task that scores
  with reward.fns (table) those functions, which the user wrote."""
  fns = getattr(task, "rewards", None)
  if getattr(getattr(task, "reward", None), "name", None) or getattr(task, "reward_fn", None) \
      or not fns or not all(isinstance(getattr(r, "name", None), str) for r in fns):
    return repr(reward_name(task))
  return f"reward.fns={','.join(r.name for r in fns)!r}"


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
  raise RewardContractError(f"the reward function {_reward_label(task)} returned {got} for "
                            f"{rows} completions; it must return one finite number per "
                            f"completion, shape ({rows},).")


def guarded_score(task, prompts, tokens, mask, group_size: int, on_error: str):
  """task.score(prompts, tokens, mask, group_size) -> (rewards, failed (B,) bool).

  A completion whose reward raises or is not finite stops the run with a RewardError showing
  its prompt and completion (on_error="raise"), or is scored 0 and marked failed
  (on_error="zero"; the caller counts them and zeroes what else it scores for those rows).
  Where the batch call returned, the completions at fault are its non-finite values and every
  other row keeps the batch's value; only a batch call that raised scores the rows one by one.
  """
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  try:
    rewards = task.score(prompts, tokens, mask, group_size)
  except RunStopped:
    raise
  except Exception as e:  # noqa: BLE001
    _refuse_wrong_count(e, "training", tokens.shape[0])
    ok, first_error = None, e
  else:
    _check_reward_shape(task, rewards, tokens.shape[0])
    ok, first_error = _finite_in_float32(rewards), None
  if ok is not None and ok.all():
    return np.asarray(rewards, np.float32), np.zeros(tokens.shape[0], bool)
  if ok is not None:  # a reward may depend on the batch: the good rows keep the batch's values
    values = np.asarray(rewards, np.float64)
    failures = {int(row): (f"the reward function returned {float(values[row])}", None)
                for row in np.flatnonzero(~ok)}
    rewards = np.where(ok, values, 0.0).astype(np.float32)
  else:
    rewards, failures = _score_rows(task, prompts, tokens, mask, group_size)
    if not failures:  # the batch raised but every completion scores alone: a batch-level bug
      raise RewardError(f"the reward function failed on the whole batch ({first_error!r}) but "
                        f"on no completion alone; fix its batch handling.") from first_error
  if on_error == "raise":
    row, (what, error) = min(failures.items())
    one = take_rows(prompts, np.array([row // group_size]))
    prompt = _text(task.tokenizer, one.prompt_tokens[0], one.prompt_mask[0])
    raise RewardError(
        f"{what} for the prompt {prompt!r} and the completion "
        f"{_text(task.tokenizer, tokens[row], mask[row])!r}; fix the reward function, or set "
        f"train.on_reward_error='zero' to score such completions 0 and count them.") from error
  return rewards, np.isin(np.arange(tokens.shape[0]), list(failures))


def _eval_row_failure(task, batch, tokens, mask, row: int):
  """What went wrong scoring one held-out completion alone (None if nothing)."""
  try:
    scores = task.eval_scores(take_rows(batch, np.array([row])), tokens[row:row + 1],
                              mask[row:row + 1])
  except RunStopped:
    raise
  except Exception as e:  # noqa: BLE001  a user's reward function may raise anything
    return _what_failed(e)
  for name, values in scores.items():
    value = np.asarray(values, np.float64).reshape(-1)
    if value.size != 1 or not np.isfinite(value[0]):
      return (f"the reward function gave {name}="
              f"{value.tolist() if value.size != 1 else value[0]}")
  return None


def guarded_eval_scores(task, batch, tokens, mask, on_error: str, where: str = "held-out",
                        counted_in: str = "eval_reward_errors"):
  """task.eval_scores(batch, tokens, mask) -> ({metric: (B,) array}, failed (B,) bool), under
  train.on_reward_error as training rewards are: a held-out completion whose scoring raises or
  is not finite stops the run with a RewardError showing it ("raise"), or scores 0 in every
  metric and is marked ("zero"), so that no NaN reaches metrics.jsonl. Messages call the
  prompts `where` ("training" where Training-Free GRPO grades its training completions with
  these scores) and the count the metric `counted_in`."""
  held_out = where == "held-out"
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  rows = tokens.shape[0]
  try:
    scores = {k: np.asarray(v) for k, v in task.eval_scores(batch, tokens, mask).items()}
  except RunStopped:
    raise
  except Exception as e:  # noqa: BLE001
    _refuse_wrong_count(e, where, rows)
    scores = None
  if scores is not None:  # one score per prompt, as (B,) or e.g. (B, 1)
    scores = {k: v.reshape(rows) if v.size == rows else v for k, v in scores.items()}
    for name, v in scores.items():
      if v.shape != (rows,):
        raise RewardContractError(f"the {where} scoring of {_reward_label(task)} returned "
                                  f"{name} of shape {v.shape} for {rows} completions; it must "
                                  f"return one number per completion, shape ({rows},).")
  # (the scores keep their dtype)
  try:
    ok = scores is not None and all(np.isfinite(np.asarray(v, np.float64)).all()
                                    for v in scores.values())
  except (TypeError, ValueError):
    raise RewardContractError(f"the {where} scoring of {_reward_label(task)} returned "
                              f"values that are not numbers; it must return one number per "
                              f"completion.") from None
  if ok:
    return scores, np.zeros(rows, bool)
  failures = {r: what for r in range(rows)
              if (what := _eval_row_failure(task, batch, tokens, mask, r)) is not None}
  if not failures:
    raise RewardError(f"the {where} scoring of {_reward_label(task)} failed on the whole batch "
                      f"but on no completion alone; fix its batch handling.")
  if on_error == "raise":
    row, what = min(failures.items())
    one = take_rows(batch, np.array([row]))
    prompt = _text(task.tokenizer, one.prompt_tokens[0], one.prompt_mask[0])
    raise RewardError(
        f"{'evaluation: ' if held_out else ''}{what} for the {where} prompt {prompt!r} and the "
        f"completion {_text(task.tokenizer, tokens[row], mask[row])!r}; fix the reward "
        f"function, or set train.on_reward_error='zero' to score such completions 0 and count "
        f"them ({counted_in}).")
  failed = np.isin(np.arange(rows), list(failures))
  if scores is None:  # the batch call raised: score the rows that work one at a time
    ok_rows = [r for r in range(rows) if r not in failures]
    parts = [task.eval_scores(take_rows(batch, np.array([r])), tokens[r:r + 1], mask[r:r + 1])
             for r in ok_rows]
    scores = {k: np.zeros(rows) for k in parts[0]} if parts else {"eval_accuracy":
                                                                    np.zeros(rows)}
    for r, part in zip(ok_rows, parts):
      for k, v in part.items():
        scores[k][r] = float(np.asarray(v, np.float64).reshape(-1)[0])
  return {k: np.where(failed, 0.0, np.nan_to_num(v)) for k, v in scores.items()}, failed
