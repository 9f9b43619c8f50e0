"""Loading the run's model-backed rewards and teacher where the models are loaded: reward
models, the process reward model and the distillation teacher, each frozen and placed on the
mesh like the policy, handed to grpo_jax/rewards/sources.py's RewardSources (rewards/ itself
imports no model code)."""

from __future__ import annotations

import contextlib
import pathlib

import jax

from grpo_jax.errors import ConfigError, first_line
from grpo_jax.models.hf import (VOCABULARY_FILES, has_tokenizer_files, load_hf_checkpoint,
                                same_vocabulary)
from grpo_jax.models.partitioning import place
from grpo_jax.models.process_reward_model import prm_token_scores, step_rewards_from_token_scores
from grpo_jax.models.reward_model import load_reward_model, sequence_reward
from grpo_jax.models.scoring import completion_logprobs
from grpo_jax.rewards.guard import reward_name
from grpo_jax.rewards.sources import (ProcessModelSource, RemoteSource, RewardModelSource,
                                      RewardSources, TeacherSource, check_names,
                                      remote_config)
from grpo_jax.train.run.sections import ModelSection, RewardSection


def build_reward_sources(rewards: RewardSection, model: ModelSection, task,
                         mesh=None) -> RewardSources:
  """The run's RewardSources: reward models loaded (frozen, on the mesh like the policy), the
  task's rule reward under its own name (rewards/guard.py `reward_name`; its metric
  `reward/<name>_mean`)."""
  reward, rule_name = rewards.reward, reward_name(task)
  if reward is not None:
    check_names(reward, rule_name)
  teacher = _teacher(rewards, model, task, mesh)
  if reward is None:
    return RewardSources(rule_name=rule_name, teacher=teacher)
  models = []
  for i, m in enumerate(rewards.entries("models")):
    path = pathlib.Path(m["path"])
    cfg, params, _ = load_reward_model(path, model.param_dtype, model.compute_dtype)
    params = place(params, mesh)
    mode = m.get("tokenizer", "auto")
    with _tokenizer_sentence(i, mode, path):
      own = mode == "own" or (mode == "auto" and not same_vocabulary(path, task.tokenizer))
      tokenizer = None
      if own and not has_tokenizer_files(path):  # transformers would make an empty one
        raise FileNotFoundError(f"no {' / '.join(VOCABULARY_FILES)}")
      if own:
        from transformers import AutoTokenizer  # noqa: PLC0415
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not own and cfg.vocab_size < len(task.tokenizer):
      raise ConfigError(f"reward.models[{i}] ({path}) has vocab_size={cfg.vocab_size} but reads "
                        f"the policy's {len(task.tokenizer)}-token ids; set "
                        f"reward.models[{i}].tokenizer='own' (its folder needs a tokenizer).")
    score = jax.jit(lambda p, pt, pm, t, tm, cfg=cfg: sequence_reward(p, cfg, pt, pm, t, tm))
    models.append(RewardModelSource(m.get("name") or f"rm{i}", float(m.get("weight", 1.0)), cfg,
                                    params, score, tokenizer, int(m.get("max_tokens", 1024))))
  remote = [RemoteSource(r.get("name") or f"remote{i}", float(r.get("weight", 1.0)),
                         remote_config(r, i)) for i, r in enumerate(rewards.entries("remote"))]
  return RewardSources(float(reward["rule_weight"]), rule_name, tuple(models),
                       tuple(remote), reward["combine"],
                       _process_model(rewards.process_model, model, mesh), teacher)


@contextlib.contextmanager
def _tokenizer_sentence(i: int, mode: str, path: pathlib.Path):
  """A reward model's own tokenizer that does not load (no or damaged files): one sentence."""
  try:
    yield
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise ConfigError(f"reward.models[{i}].tokenizer={mode!r} reads the tokenizer of {path}, "
                      f"which does not load ({first_line(e)}); copy the tokenizer files there "
                      f"(an exported reward model has none), or set reward.models[{i}]."
                      f"tokenizer='policy'.") from None


def _teacher(rewards: RewardSection, model: ModelSection, task, mesh) -> TeacherSource | None:
  """rl.distill_teacher's model (any HF causal LM folder with the policy's tokenizer), frozen and
  placed like the policy, or the teacher served at that URL (RemoteTeacher), or None when the
  run does not distil."""
  distill_teacher = rewards.distill_teacher
  if distill_teacher is None:
    return None
  from grpo_jax.rewards.remote_teacher import RemoteTeacher, is_url  # noqa: PLC0415
  if is_url(distill_teacher):  # served elsewhere (python -m grpo_jax.serve_teacher)
    return RemoteTeacher.connect(distill_teacher, task.tokenizer,
                                 None if model.uses_checkpoint else model.vocab_size,
                                 rewards.distill_teacher_token_env,
                                 **(rewards.distill_teacher_client or {}))
  path = pathlib.Path(distill_teacher)
  if not same_vocabulary(path, task.tokenizer):
    raise ConfigError(f"rl.distill_teacher={str(path)!r} has another tokenizer than the policy's; "
                      f"on-policy distillation compares log-probs token by token, so the "
                      f"teacher must share the policy's vocabulary.")
  cfg, params = load_hf_checkpoint(path, model.param_dtype, model.compute_dtype)
  if cfg.vocab_size != model.vocab_size and not model.uses_checkpoint:
    raise ConfigError(f"rl.distill_teacher={str(path)!r} has vocab_size={cfg.vocab_size}, the "
                      f"policy {model.vocab_size}; the teacher must share the policy's "
                      f"tokenizer.")
  params = place(params, mesh)

  def logprobs(p, pt, pm, t, tm):
    return completion_logprobs(p, cfg, pt, pm, t, tm)[0]
  return TeacherSource(params, jax.jit(logprobs))


def _process_model(pm: dict | None, model: ModelSection, mesh):
  """reward.process_model's PRM (a causal LM folder sharing the policy's tokenizer), or None."""
  if pm is None:
    return None
  cfg, params = load_hf_checkpoint(pm["path"], model.param_dtype, model.compute_dtype)
  params = place(params, mesh)
  ids = dict(separator_id=int(pm["separator_id"]), good_id=int(pm["good_id"]),
             bad_id=int(pm["bad_id"]))
  score_last, max_steps = bool(pm["score_last"]), int(pm["max_steps"])

  def steps(p, pt, pm_, t, tm):
    scores, ends = prm_token_scores(p, cfg, pt, pm_, t, tm, score_last=score_last, **ids)
    return step_rewards_from_token_scores(scores, ends, max_steps)
  return ProcessModelSource(params, jax.jit(steps))
