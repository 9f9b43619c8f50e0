"""A step's rewards from several sources at once: the task's rule reward, learned outcome
reward models (reward.models) and remote reward servers (reward.remote), combined with weights
(grpo_jax/rewards/combine.py), each one kept for its own metric (`reward/<name>_mean`).

    r_b = sum_k w_k c_{b,k}                                        reward.combine = "sum"
    r_b = sum_k w_k (c_{b,k} - mean_g c_k) / (std_g c_k + eps)      "normalise_then_sum" (GDPO)

Each source fails on its own: the rule reward through rewards/guard.guarded_score (per row),
a reward model where its score is not finite, a remote server per chunk of rows (its error
line names the URL and the reason). A row that fails in any source is scored 0 and counted
(train.on_reward_error = "zero"), or the first failure stops the run with its message ("raise").

A reward model reads the policy's tokens as they are when it shares the policy's tokenizer (its
folder has no tokenizer files, or the same vocabulary: the fast path), else the decoded prompt
and completion, re-tokenised with its own tokenizer and chat template.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError, RewardError
from grpo_jax.rewards.combine import COMBINE_MODES, combine_rewards
from grpo_jax.rewards.guard import guarded_score

RULE = "rule"


@dataclasses.dataclass(frozen=True)
class RewardModelSource:
  """A frozen outcome reward model: score(prompts, tokens, mask, group_size) -> (B,)."""
  name: str
  weight: float
  model_cfg: Any
  params: Any
  score_tokens: Callable  # jitted (params, prompt_tokens, prompt_mask, tokens, mask) -> (B,)
  tokenizer: Any = None  # its own tokenizer (re-tokenising path), or None (the policy's)
  max_tokens: int = 1024  # re-tokenised rows are cut to this many tokens (from the left)

  def score(self, task, prompts, tokens, mask, group_size: int) -> np.ndarray:
    if self.tokenizer is None:
      prompt_tokens, prompt_mask = row_prompts(prompts, group_size)
      return np.asarray(self.score_tokens(self.params, prompt_tokens, prompt_mask, tokens, mask))
    prompt_texts, completions, _ = row_texts(task, prompts, tokens, mask, group_size)
    ids, ids_mask = retokenise(self.tokenizer, prompt_texts, completions, self.max_tokens)
    empty = np.zeros((ids.shape[0], 0), np.int32)
    return np.asarray(self.score_tokens(self.params, empty, empty.astype(bool), ids, ids_mask))


@dataclasses.dataclass(frozen=True)
class ProcessModelSource:
  """A frozen process reward model (grpo_jax/models/process_reward_model.py) giving the
  process estimator's step rewards instead of the task (reward.process_model)."""
  params: Any
  step_fn: Callable  # jitted (params, prompt_tokens, prompt_mask, tokens, mask) -> 3 arrays

  def step_rewards(self, prompts, tokens, mask, group_size: int):
    steps = self.step_fn(self.params, *row_prompts(prompts, group_size), tokens, mask)
    return tuple(np.asarray(x) for x in steps)


@dataclasses.dataclass(frozen=True)
class TeacherSource:
  """A frozen distillation teacher (rl.distill_teacher; grpo_jax/rl/distill.py) with the policy's
  tokenizer: logprobs(prompts, tokens, mask, group_size) -> (B, N) its log-probs of the tokens."""
  params: Any
  logprob_fn: Callable  # jitted (params, prompt_tokens, prompt_mask, tokens, mask) -> (B, N)

  def logprobs(self, prompts, tokens, mask, group_size: int) -> np.ndarray:
    prompt_tokens, prompt_mask = row_prompts(prompts, group_size)
    return np.asarray(self.logprob_fn(self.params, prompt_tokens, prompt_mask, tokens, mask))


@dataclasses.dataclass(frozen=True)
class RemoteSource:
  name: str
  weight: float
  config: Any  # grpo_jax.rewards.remote.RemoteRewardConfig


@dataclasses.dataclass(frozen=True)
class RewardSources:
  """Every reward of a run and how they combine."""
  rule_weight: float = 1.0
  rule_name: str = RULE
  models: tuple = ()
  remote: tuple = ()
  combine: str = "sum"
  process_model: ProcessModelSource | None = None  # step rewards from a PRM, or the task's
  teacher: TeacherSource | None = None  # the distillation teacher (rl.distill_coef > 0)

  def __post_init__(self):
    """Every weight checked as the config's are (`check_weight`), so that one built in Python
    is refused in the config path's sentence (e.g. rule_weight=nan: reward.rule_weight=nan is
    not a finite number), before any reward is scored with it."""
    check_weight(self.rule_weight, "reward.rule_weight")
    for field, sources in (("models", self.models), ("remote", self.remote)):
      for i, source in enumerate(sources):
        check_weight(source.weight, f"reward.{field}[{i}].weight")

  @property
  def only_rule(self) -> bool:
    """The task's rule reward alone, unweighted and summed (reward.combine="normalise_then_sum"
    normalises it within each group): scored exactly as without this module."""
    return (not self.models and not self.remote and self.rule_weight == 1.0
            and self.combine == "sum")

  @property
  def names(self) -> tuple:
    rule = (self.rule_name,) if self.rule_weight else ()
    return rule + tuple(s.name for s in self.models) + tuple(s.name for s in self.remote)

  def score(self, task, prompts, tokens, mask, group_size: int, on_error: str):
    """(rewards (B,) float32, failed (B,) bool, {name: (B,) component}) of the completions."""
    tokens, mask = np.asarray(tokens), np.asarray(mask).astype(bool)
    if self.only_rule:
      rewards, failed = guarded_score(task, prompts, tokens, mask, group_size, on_error)
      return rewards, failed, {self.rule_name: rewards}
    rows = tokens.shape[0]
    components, weights, failed = {}, [], np.zeros(rows, bool)
    if self.rule_weight:
      values, bad = guarded_score(task, prompts, tokens, mask, group_size, on_error)
      components[self.rule_name], failed = values, failed | bad
      weights.append(self.rule_weight)
    for source in self.models:
      values = np.asarray(source.score(task, prompts, tokens, mask, group_size), np.float32)
      bad = ~np.isfinite(values)
      if bad.any() and on_error == "raise":
        raise RewardError(f"reward model {source.name!r} gave a non-finite score "
                          f"{values[bad][0]} (row {int(np.argmax(bad))}); check its weights, "
                          f"or set train.on_reward_error='zero' to score such completions 0 "
                          f"and count them.")
      components[source.name], failed = np.where(bad, 0.0, values), failed | bad
      weights.append(source.weight)
    if self.remote:
      from grpo_jax.rewards.remote import raise_first, score_remote  # noqa: PLC0415
      prompt_texts, completions, labels = row_texts(task, prompts, tokens, mask, group_size)
      queries = [p + c for p, c in zip(prompt_texts, completions)]
      for source in self.remote:
        result = score_remote(source.config, queries, prompt_texts, labels)
        if on_error == "raise":
          raise_first(result)
        components[source.name] = np.where(result.failed, 0.0, result.rewards)
        failed = failed | result.failed
        weights.append(source.weight)
    matrix = np.stack([components[n] for n in components], axis=1).astype(np.float32)
    matrix = np.where(failed[:, None], 0.0, matrix)
    rewards = np.asarray(combine_rewards(jnp.asarray(matrix), jnp.asarray(weights, jnp.float32),
                                         group_size, self.combine), np.float32)
    return np.where(failed, 0.0, rewards), failed, {n: matrix[:, i]
                                                    for i, n in enumerate(components)}


# ----------------------------------------------------------------------------- rows


def row_prompts(prompts, group_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Per completion row: (prompt_tokens, prompt_mask) of its prompt, each prompt's row repeated
  group_size times (groups contiguous)."""
  return (np.repeat(np.asarray(prompts.prompt_tokens), group_size, 0),
          np.repeat(np.asarray(prompts.prompt_mask), group_size, 0))


def row_texts(task, prompts, tokens, mask, group_size: int):
  """Per completion row: (prompt text, completion text, label) as a remote server or another
  tokenizer reads them: the task's prompt_texts, decode and labels (the gold answer)."""
  completions = list(task.decode(tokens, mask))
  repeat = lambda xs: [x for x in xs for _ in range(group_size)]  # noqa: E731
  return repeat(list(task.prompt_texts(prompts))), completions, repeat(list(task.labels(prompts)))


def retokenise(tokenizer, prompts: list, completions: list, max_tokens: int):
  """Rows [chat-templated user prompt + assistant completion] in `tokenizer`'s ids, right-padded
  to a multiple of 64 (few compiled shapes): (ids (B, T) int32, mask (B, T) bool)."""
  rows = []
  for prompt, completion in zip(prompts, completions):
    if getattr(tokenizer, "chat_template", None):
      text = tokenizer.apply_chat_template(
          [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
          tokenize=False)
    else:
      text = prompt + completion
    rows.append(tokenizer(text, add_special_tokens=False)["input_ids"][-max_tokens:])
  width = max(64, -(-max(len(r) for r in rows) // 64) * 64)
  ids = np.zeros((len(rows), width), np.int32)
  ids_mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    ids[i, :len(r)], ids_mask[i, :len(r)] = r, True
  return ids, ids_mask


# ----------------------------------------------------------------------------- building


def config_entries(section, key: str) -> list:
  """reward.<key>'s entries as dicts, or a ConfigError naming one that is not a dict."""
  value = section.get(key, ()) if section is not None else ()
  for i, v in enumerate(value or ()):
    if not hasattr(v, "keys"):
      example = "{'url': 'http://127.0.0.1:8000/score'}" if key == "remote" else "{'path': DIR}"
      raise ConfigError(f"reward.{key}[{i}]={v!r} is not an entry of fields; give a dict, e.g. "
                        f"{example}.")
  return [dict(v) for v in (value or ())]


def check_reward_config(config) -> None:
  """ConfigError sentences for reward.models / reward.remote / reward.combine, before compute."""
  reward = config.get("reward")
  if reward is None:
    return
  if reward.fns.strip() and config.task.name != "table":
    raise ConfigError(f"reward.fns={reward.fns!r} scores the rows of task.name='table' (your own "
                      f"data), but task.name={config.task.name!r} scores with reward.name; set "
                      f"task.name='table' with data.source, or clear reward.fns.")
  combine = reward.combine
  if combine not in COMBINE_MODES:
    raise ConfigError(f"reward.combine={combine!r} is unknown; valid: {', '.join(COMBINE_MODES)}.")
  group_size = config.rollout.group_size if config.get("rollout") is not None else 2
  if combine == "normalise_then_sum" and group_size < 2:
    raise ConfigError(f"reward.combine='normalise_then_sum' normalises each reward within a "
                      f"prompt's group, but rollout.group_size={group_size} has no group standard "
                      f"deviation; use rollout.group_size >= 2 or reward.combine='sum'.")
  rule_weight = check_weight(reward.rule_weight, "reward.rule_weight")
  models, remote = config_entries(reward, "models"), config_entries(reward, "remote")
  if rule_weight == 0 and not models and not remote:
    raise ConfigError("reward.rule_weight=0 with no reward.models and no reward.remote leaves "
                      "no reward; add a reward model or a remote reward, or set rule_weight > 0.")
  for i, m in enumerate(models):
    if unknown := set(m) - {"path", "weight", "name", "tokenizer", "max_tokens"}:
      raise ConfigError(f"reward.models[{i}] has unknown field(s) {sorted(unknown)}; valid: "
                        f"path, weight, name, tokenizer, max_tokens.")
    if not m.get("path"):
      raise ConfigError(f"reward.models[{i}] has no path; set it to a local "
                        f"*ForSequenceClassification folder.")
    if m.get("tokenizer", "auto") not in ("auto", "policy", "own"):
      raise ConfigError(f"reward.models[{i}].tokenizer={m['tokenizer']!r}; use auto, policy or "
                        f"own.")
    check_weight(m.get("weight", 1.0), f"reward.models[{i}].weight")
    max_tokens = m.get("max_tokens", 1024)
    if not (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1):
      raise ConfigError(f"reward.models[{i}].max_tokens={max_tokens!r}; give the number of tokens "
                        f"a re-tokenised row keeps, an integer >= 1 (e.g. 1024).")
  for i, r in enumerate(remote):
    from grpo_jax.rewards.remote import RemoteRewardConfig  # noqa: PLC0415
    fields = {f.name for f in dataclasses.fields(RemoteRewardConfig)} | {"weight"}
    if unknown := set(r) - fields:
      raise ConfigError(f"reward.remote[{i}] has unknown field(s) {sorted(unknown)}; valid: "
                        f"{', '.join(sorted(fields))}.")
    if not r.get("url"):
      raise ConfigError(f"reward.remote[{i}] has no url; set it to the scoring server's address, "
                        f"e.g. 'http://127.0.0.1:8000/score'.")
    check_weight(r.get("weight", 1.0), f"reward.remote[{i}].weight")
    remote_config(r, i).check(f"reward.remote[{i}]")
  if uses_process_model(config):
    pm = reward.process_model
    for field in ("separator_id", "good_id", "bad_id"):
      if not (isinstance(pm[field], int) and pm[field] >= 0):
        raise ConfigError(f"reward.process_model.{field}={pm[field]!r}; give the token id (of "
                          f"the policy's tokenizer, which the PRM shares).")
    if pm.max_steps < 1:
      raise ConfigError(f"reward.process_model.max_steps={pm.max_steps}; use at least 1.")
  check_names(reward)


def check_weight(value, field: str) -> float:
  """`value` if it is a finite real number, else a ConfigError naming `field`."""
  if not (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value)):
    raise ConfigError(f"{field}={value!r} is not a finite number; give the reward's weight as a "
                      f"real number, e.g. 1.0.")
  return float(value)


def check_names(reward, rule_name: str | None = None) -> None:
  """A ConfigError when two rewards share a name (each is a column and a metric of its own): the
  reward.models and reward.remote entries, and the task's rule reward `rule_name` if weighted."""
  fields = [(f"reward.models[{i}]", m.get("name") or f"rm{i}")
            for i, m in enumerate(config_entries(reward, "models"))] + [
      (f"reward.remote[{i}]", r.get("name") or f"remote{i}")
      for i, r in enumerate(config_entries(reward, "remote"))]
  names = [name for _, name in fields]
  if len(set(names)) != len(names):
    raise ConfigError(f"reward names {names} repeat; give each reward.models / reward.remote "
                      f"entry its own name.")
  if rule_name is not None and reward["rule_weight"] and rule_name in names:
    field = fields[names.index(rule_name)][0]
    raise ConfigError(f"{field}.name={rule_name!r} is also the name of the task's rule reward "
                      f"(reward.rule_weight > 0), whose scores it would overwrite; give {field} "
                      f"another name.")


def remote_config(entry: dict, index: int):
  from grpo_jax.rewards.remote import RemoteRewardConfig  # noqa: PLC0415
  fields = {k: v for k, v in entry.items() if k != "weight"}
  fields.setdefault("name", f"remote{index}")
  if isinstance(fields.get("headers"), (list, tuple)):  # else the check names its type
    fields["headers"] = tuple(tuple(h) if isinstance(h, (list, tuple)) else h
                              for h in fields["headers"])
  return RemoteRewardConfig(**fields)


def uses_process_model(config) -> bool:
  reward = config.get("reward")
  return bool(reward and reward.get("process_model") and reward.process_model.get("path"))
