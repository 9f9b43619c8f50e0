"""Checks on a resolved config, run before any compute. Each failure is one sentence naming the
value and the fix."""

from __future__ import annotations

ADVANTAGES = ("grpo", "dr_grpo")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
TASKS = ("addition",)


class ConfigError(ValueError):
  """A config value that cannot work; the message says which and how to fix it."""


def _require(condition: bool, message: str):
  if not condition:
    raise ConfigError(message)


def validate(config) -> None:
  r, rl, tr, opt = config.rollout, config.rl, config.train, config.optim
  _require(config.task.name in TASKS,
           f"task.name={config.task.name!r} is unknown; valid: {', '.join(TASKS)}.")
  _require(rl.advantage in ADVANTAGES,
           f"rl.advantage={rl.advantage!r} is unknown; valid: {', '.join(ADVANTAGES)}.")
  _require(rl.loss_aggregation in LOSS_AGGREGATIONS,
           f"rl.loss_aggregation={rl.loss_aggregation!r} is unknown; valid: "
           f"{', '.join(LOSS_AGGREGATIONS)}.")
  _require(r.num_prompts >= 1, f"rollout.num_prompts={r.num_prompts}; use at least 1.")
  _require(r.group_size >= 1, f"rollout.group_size={r.group_size}; use at least 1.")
  if rl.advantage == "grpo":
    _require(r.group_size >= 2,
             f"rollout.group_size={r.group_size} with rl.advantage='grpo' has no group "
             f"standard deviation to normalise by; use group_size >= 2 (or rl.advantage="
             f"'dr_grpo' with group_size >= 2).")
  if rl.advantage == "dr_grpo":
    _require(r.group_size >= 2,
             f"rollout.group_size={r.group_size} leaves a group of one, whose advantage "
             f"r - mean(r) is always 0; use group_size >= 2.")
  batch = r.num_prompts * r.group_size
  _require(rl.num_minibatches >= 1 and batch % rl.num_minibatches == 0,
           f"the rollout batch of {batch} completions (rollout.num_prompts={r.num_prompts} x "
           f"rollout.group_size={r.group_size}) does not split into rl.num_minibatches="
           f"{rl.num_minibatches} equal minibatches; pick a divisor of {batch}.")
  _require(rl.num_iterations >= 1, f"rl.num_iterations={rl.num_iterations}; use at least 1.")
  _require(r.temperature >= 0, f"rollout.temperature={r.temperature}; use >= 0 (0 = greedy).")
  _require(0 < r.top_p <= 1, f"rollout.top_p={r.top_p}; use a value in (0, 1].")
  _require(rl.clip_eps > 0, f"rl.clip_eps={rl.clip_eps}; use a positive value such as 0.2.")
  _require(rl.kl_coef >= 0, f"rl.kl_coef={rl.kl_coef}; use a value >= 0 (0 turns KL off).")
  _require(tr.steps >= 1, f"train.steps={tr.steps}; use at least 1.")
  _require(tr.eval_every >= 1, f"train.eval_every={tr.eval_every}; use at least 1.")
  _require(tr.eval_batch_size >= 1 and tr.eval_size % tr.eval_batch_size == 0,
           f"train.eval_size={tr.eval_size} is not a multiple of train.eval_batch_size="
           f"{tr.eval_batch_size}; pick a divisor.")
  _require(opt.learning_rate > 0, f"optim.learning_rate={opt.learning_rate}; use > 0.")
  m = config.model
  _require(m.num_heads % m.num_kv_heads == 0,
           f"model.num_heads={m.num_heads} is not a multiple of model.num_kv_heads="
           f"{m.num_kv_heads}; grouped-query attention needs heads = kv_heads x group.")
