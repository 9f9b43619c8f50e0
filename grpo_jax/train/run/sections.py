"""Typed sections of a validated config. Each room of a run reads the frozen section it needs,
built once at the top of its stage (`Sections.of`), not the config: set-up and export read
`ModelSection`, the held-out evaluation `EvalSection`, the model-backed rewards
`RewardSection`, the device start `DeviceSection`. The task registry alone builds from the
whole config (its plugins' contract), and the run record writes it whole."""

from __future__ import annotations

import dataclasses
from typing import Optional

from grpo_jax.models.config import ModelConfig
from grpo_jax.rewards.sources import check_reward_config, config_entries
from grpo_jax.train.run.runner import Schedule


@dataclasses.dataclass(frozen=True)
class LoraSection:
  """config.lora when lora.rank > 0."""
  rank: int
  alpha: float
  use_rslora: bool
  targets: str
  export_adapter: bool

  @classmethod
  def of(cls, config) -> Optional["LoraSection"]:
    lo = config.get("lora")  # (a config without the section: full fine-tuning)
    if lo is None or lo.rank <= 0:
      return None
    return cls(int(lo.rank), float(lo.alpha), bool(lo.use_rslora), lo.targets,
               bool(lo.get("export_adapter", False)))


@dataclasses.dataclass(frozen=True)
class ModelSection:
  """What set-up (run/setup.py), the reward models and export read of config.model, config.lora
  and train.export*."""
  path: str  # model.path: a Hugging Face folder, "" for a random model
  param_dtype: str
  compute_dtype: str
  # (name, value) of model.remat / logits_chunk / attention_impl / context_layout, over the folder's
  layout: tuple
  vocab_size: int  # model.vocab_size (a random model's; the teacher's check)
  random: Optional[ModelConfig]  # the random model's config; None under model.path
  lora: Optional[LoraSection]  # None: full fine-tuning
  export: bool = False  # train.export, export_dtype, export_max_shard_mb
  export_dtype: str = "float32"
  export_max_shard_bytes: int = 0  # 0: one file
  # model.vision's (name, value) pairs: a vision-language model (run/setup.py build_model);
  # None: text only.
  vision: Optional[tuple] = None

  @property
  def uses_checkpoint(self) -> bool:
    return bool(self.path)

  @classmethod
  def of(cls, config) -> "ModelSection":
    m, t = config.model, config.get("train", {})
    layout = tuple((k, m[k]) for k in ("remat", "logits_chunk", "attention_impl",
                                              "context_layout") if k in m)
    return cls(m.path or "", m.param_dtype, m.compute_dtype, layout, int(m.vocab_size),
               # (a vision-language model under a folder holding only its tokenizer is random)
               None if m.path and m.get("vision") is None else ModelConfig.from_config_dict(m),
               LoraSection.of(config),
               bool(t.get("export", False)), t.get("export_dtype", "float32"),
               int(t.get("export_max_shard_mb", 0.0) * 2**20),
               None if m.get("vision") is None else tuple(sorted(dict(m.vision).items())))


@dataclasses.dataclass(frozen=True)
class SamplingSection:
  """config.rollout's sampling settings (rollout/sampler.py `Sampling.of` reads these)."""
  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  decode_block: int = 0
  decode_slots: int = 0
  decode_loop: str = "auto"

  @classmethod
  def of(cls, rollout) -> "SamplingSection":
    return cls(int(rollout.max_new_tokens), float(rollout.temperature), int(rollout.top_k),
               float(rollout.top_p), int(rollout.get("decode_block", 0)),
               int(rollout.get("decode_slots", 0)), rollout.get("decode_loop", "auto"))


@dataclasses.dataclass(frozen=True)
class EvalSection:
  """What the held-out evaluation reads (run/evaluation.py): train.eval_* and num_samples,
  train.on_reward_error, data.prompt_bucket and the rollout's sampling."""
  eval_size: int
  eval_batch_size: int
  eval_pass_k: int
  on_reward_error: str
  num_samples: int
  prompt_bucket: int
  rollout: SamplingSection

  @classmethod
  def of(cls, config) -> "EvalSection":
    t = config.train
    return cls(int(t.eval_size), int(t.eval_batch_size), int(t.eval_pass_k),
               t.on_reward_error, int(t.num_samples),
               int(config.data.prompt_bucket) if "data" in config else 0,
               SamplingSection.of(config.rollout))


@dataclasses.dataclass(frozen=True)
class RewardSection:
  """What the model-backed rewards read (run/reward_models.py): config.reward as plain data
  (None without the section) and the distillation teacher (None when the run does not
  distil)."""
  reward: Optional[dict]
  distill_teacher: Optional[str]
  distill_teacher_token_env: str = ""  # the variable holding a teacher server's token
  # a teacher URL's client: {timeout_s, max_retries, backoff_s} (rl.distill_teacher_*)
  distill_teacher_client: Optional[dict] = None

  @property
  def process_model(self) -> Optional[dict]:
    pm = (self.reward or {}).get("process_model") or None
    return pm if pm and pm.get("path") else None

  def entries(self, key: str) -> list:
    return config_entries(self.reward, key)

  @classmethod
  def of(cls, config) -> "RewardSection":
    check_reward_config(config)
    reward = config.get("reward")
    rl = config.get("rl")
    teacher = (rl.distill_teacher if rl is not None and rl.get("distill_coef", 0) > 0 else None)
    client = ({k: rl[f"distill_teacher_{k}"] for k in ("timeout_s", "max_retries", "backoff_s")
               if f"distill_teacher_{k}" in rl} if teacher else None)
    return cls(None if reward is None else reward.to_dict(), teacher,
               (rl.get("distill_teacher_token_env") or "") if teacher else "", client)


@dataclasses.dataclass(frozen=True)
class DistributedSection:
  """config.distributed (parallel/distributed.py `initialize` reads it)."""
  mode: str
  coordinator_address: str
  num_processes: int
  process_id: int


@dataclasses.dataclass(frozen=True)
class DeviceSection:
  """What the device start reads: config.distributed (None: one process),
  train.compilation_cache, and the mesh's axis sizes (config.mesh)."""
  distributed: Optional[DistributedSection]
  compilation_cache: str
  mesh: dict

  @classmethod
  def of(cls, config) -> "DeviceSection":
    d = config.get("distributed")
    dist = None if d is None else DistributedSection(
        d.mode, d.get("coordinator_address", ""), int(d.get("num_processes", 0)),
        int(d.get("process_id", -1)))
    return cls(dist, config.train.compilation_cache, dict(config.mesh))


@dataclasses.dataclass(frozen=True)
class LoopSection:
  """What the host loop reads of config.train (run/runner.py's schedule, checkpoints, the
  skipped-step guard)."""
  steps: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int
  max_consecutive_skips: int
  no_signal_steps: int = 10  # a line after this many steps in a row without signal; 0 = never

  @property
  def schedule(self) -> Schedule:
    return Schedule(self.steps, self.eval_every, self.checkpoint_every)

  @classmethod
  def of(cls, config) -> "LoopSection":
    t = config.train
    return cls(int(t.steps), int(t.eval_every), int(t.checkpoint_every),
               int(t.keep_checkpoints), int(t.max_consecutive_skips),
               int(t.no_signal_steps))


@dataclasses.dataclass(frozen=True)
class Sections:
  """A stage's typed sections, built once after validation."""
  model: ModelSection
  eval: EvalSection
  rewards: RewardSection
  loop: LoopSection

  @classmethod
  def of(cls, config) -> "Sections":
    return cls(ModelSection.of(config), EvalSection.of(config), RewardSection.of(config),
               LoopSection.of(config))
