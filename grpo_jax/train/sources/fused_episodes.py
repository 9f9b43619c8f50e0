"""The episodes of a pure-JAX environment inside the one-jit RL iteration
(train.experience_source="fused_episodes", on-policy, owns the step): the "episodes" source
(train/sources/episodes.py) with the environment's reset and step written in JAX
(envs/calculator_jax.py) and the turns a lax loop (rollout/episodes/pure_jax.py), so that sampling,
the environment, the reward and the RL step of max(train.fused_steps, 1) iterations run in
one jitted lax.scan per host call, vmapped (or lax.mapped) over the run's seeds as "fused"
does: no host round-trip per turn or per step.

Iteration i of a seed plays what "episodes" plays at that step: the rows of the task's stream
[position, position + num_prompts), each repeated group_size times, episode e with id
r = position x G + e, the key rollout_key(source); the sampler's input is the prompt and the
ids so far left-padded to task.prompt_width + env.max_completion_tokens every turn, or with
env.kv_continuation each episode's KV cache continued with its new ids. The
environments with a JAX form are those whose registered class has jax_form (env, tokenizer) ->
the env's jit-static spec). On a step `samples_due`, the first seed's samples (the first episode
of each of its first train.num_samples groups, turn by turn: rollout/episodes/host.py
`episode_samples`)
go to samples_out, from ids the scan hands back; tool latency is not recorded (a pure-JAX
environment makes no host tool call).
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.envs import ENVIRONMENTS, jax_form, jax_form_names
from grpo_jax.envs import calculator  # noqa: F401  (registers env.name='calculator')
from grpo_jax.rollout.episodes.host import episode_samples
from grpo_jax.rollout.episodes.pure_jax import play_episodes
from grpo_jax.errors import ConfigError
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.learner.state import RunState, policy_params, rollout_key
from grpo_jax.train.learner.step import make_rl_step
from grpo_jax.train.run.metrics import rollout_metrics, step_record
from grpo_jax.train.run.samples import samples_due
from grpo_jax.train.sources.experience_source import register_experience_source
from grpo_jax.train.sources.fused import make_scanned_advance



def env_name(env) -> str:
  """The env.name `env` was registered under ("" if none)."""
  return next((name for name, cls in ENVIRONMENTS.items() if type(env) is cls), "")


def check_fused_episodes(run) -> None:
  """A ConfigError when the task's environment has no JAX form (the rest of what this source
  cannot run is refused by config validation: config_checks.py and data/env_task.py)."""
  task = run.task
  if jax_form(env_name(task.env)) is None:
    raise ConfigError(f"train.experience_source='fused_episodes' has no JAX form of the "
                      f"environment {env_name(task.env)!r} (it has: "
                      f"{', '.join(jax_form_names())}); use "
                      f"train.experience_source='episodes'.")


def episode_table(task, seed: int, count: int) -> dict:
  """The first `count` rows of a seed's stream as arrays {"a", "b"} (count,) int32."""
  rows = task.train_rows(0, count, seed)
  return {k: np.asarray([r[k] for r in rows], np.int32) for k in ("a", "b")}


def drawn_rows(rollout, reward, step, position, group: int, count: int) -> dict:
  """metrics["samples"]: the first episode of each of the first `count` groups (rows 0, G, ..,
  (count - 1) G) of a step's rollout, their rewards, the step the learner is at before it and
  the data position of its first prompt: what `episode_samples` needs, back on the host."""
  first = lambda x: x[::group][:count]  # noqa: E731
  return dict(completion_tokens=first(rollout.completion_tokens),
              completion_mask=first(rollout.completion_mask),
              action_mask=first(rollout.action_mask), reward=first(reward), step=step,
              position=position)


def make_episodes_iteration(run, spec):
  """iteration(run_state, table) -> (run_state, metrics): one RL step of one seed on its
  episodes, on device; with train.num_samples > 0 its metrics also hold the step's sampled
  rows (`drawn_rows`, as metrics["samples"])."""
  settings, task = run.settings, run.task
  num_prompts, group = settings.num_prompts, settings.group_size
  n, prompt_width = task.max_completion_tokens, task.prompt_len
  rl_step = make_rl_step(run.spec)
  # How many groups' first episodes a step's samples show.
  rows, count = num_prompts * group, min(settings.num_samples, num_prompts)

  def iteration(run_state, table):
    train, source = run_state.train, run_state.source
    position = source.data_position
    a, b = (jnp.repeat(jax.lax.dynamic_slice_in_dim(table[k], position, num_prompts), group)
            for k in ("a", "b"))
    ids = position * group + jnp.arange(rows, dtype=jnp.int32)
    turns = run.sampling.quantized(run.rollout.weight_dtype)  # one row per episode
    rollout, end = play_episodes(turns, policy_params(train), spec, a, b,
                                 rollout_key(source), n, prompt_width, prompt_width + n, ids,
                                 kv_continuation=getattr(task, "kv_continuation", False))
    inputs = RewardInputs(end.reward, {}, jnp.int32(num_prompts))
    version = train.step
    train, metrics = rl_step(train, rollout, inputs)
    if count:
      metrics["samples"] = drawn_rows(rollout, end.reward, version, position, group, count)
    source = source.replace(data_position=position + num_prompts, rollouts=source.rollouts + 1)
    mask = rollout.completion_mask
    metrics["rollout"] = rollout_metrics(end.reward, mask, rollout.truncated, group, xp=jnp)
    calls = jnp.sum(end.env.tool_calls)
    metrics["episodes"] = dict(
        turns_per_episode=jnp.mean(end.turns), tool_calls_per_episode=calls / rows,
        tool_error_rate=jnp.sum(end.env.tool_errors) / jnp.maximum(calls, 1),
        env_token_fraction=1.0 - jnp.sum(rollout.action_mask) / jnp.maximum(jnp.sum(mask), 1))
    metrics["step_tokens"] = (jnp.sum(rollout.prompt_mask) + jnp.sum(mask)).astype(jnp.int32)
    return RunState(train, source), metrics

  return iteration


@register_experience_source("fused_episodes", owns_step=True)
def make_fused_episodes_advance(run, state, samples_out=None):
  """make_scanned_advance's advance. On a step `samples_due`, the first seed's sample records
  are appended to samples_out (see the module docstring)."""
  check_fused_episodes(run)
  settings, axis, task = run.settings, run.axis, run.task
  spec = jax_form(env_name(task.env))(task.env, task.tokenizer)

  def record_of(one):
    stats, episodes = one.pop("rollout"), one.pop("episodes")
    return step_record(one, stats, settings.on_reward_error) | {
        key: float(v) for key, v in episodes.items()}

  def samples_of(drawn):
    step = int(drawn["step"]) + 1  # the step the episodes train (the host source's)
    if samples_out is None or not samples_due(settings, step):
      return
    count = len(drawn["reward"])
    texts = task.prompt_texts(task.prompt_batch(
        task.train_rows(int(drawn["position"]), count, axis.seeds[0])))
    samples_out.extend(episode_samples(task.tokenizer, texts, types.SimpleNamespace(**drawn),
                                       drawn["reward"], "train", step, range(count)))

  return make_scanned_advance(run, state, make_episodes_iteration(run, spec),
                              lambda s, count: episode_table(task, s, count), record_of,
                              samples_of)
