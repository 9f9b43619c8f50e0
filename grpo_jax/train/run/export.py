"""The end of a model.path run: the trained policy as a Hugging Face checkpoint and, under LoRA,
its adapters in PEFT's format (grpo_jax/models/hf_export.py)."""

from __future__ import annotations

import json
import os
import pathlib

import jax

from grpo_jax.models.config import ModelConfig
from grpo_jax.models.lora import merge
from grpo_jax.parallel import distributed
from grpo_jax.parallel.distributed import to_host
from grpo_jax.train.run import files
from grpo_jax.train.run.setup import uses_checkpoint, uses_lora


def export_model_type(config, model_cfg) -> str:
  """The model_type an exported folder gets: model.path's, else the family of the features."""
  if uses_checkpoint(config):
    return json.loads((pathlib.Path(config.model.path) / "config.json").read_text())["model_type"]
  return model_cfg.blocks.export_model_type(model_cfg)


def export_policy(config, state, model_cfg: ModelConfig, workdir: str, log,
                  export: bool | None = None) -> None:
  """train.export (or `export`, a stage's own switch): the policy as a full HF checkpoint in
  workdir/hf_export (under LoRA the adapters merged into the base); lora.export_adapter (LoRA
  only): the adapters in PEFT's format in workdir/peft_adapter."""
  lora = uses_lora(config) and config.lora.export_adapter and uses_checkpoint(config)
  export = config.train.export if export is None else export
  if not (export or lora):
    return
  # Collective: every process takes part.
  host = to_host((state.params, state.base_params))
  if not distributed.is_main_process():
    return
  from grpo_jax.models.hf_export import export_hf_checkpoint, export_peft_adapter  # noqa
  params, base = host
  if export:
    out = os.path.join(workdir, "hf_export")
    if base is None:
      full = params
    else:  # on the host's CPU: the accelerators still hold the state
      with jax.default_device(jax.devices("cpu")[0]):
        full = merge(base, params, model_cfg.lora_scale)
    t = config.train
    with files.local_folder(out) as folder:
      export_hf_checkpoint(full, model_cfg, folder, source_dir=config.model.path or None,
                           model_type=export_model_type(config, model_cfg), dtype=t.export_dtype,
                           max_shard_bytes=int(t.export_max_shard_mb * 2**20))
    log(f"exported the trained policy as a Hugging Face checkpoint ({t.export_dtype}): {out}"
        + (" (LoRA adapters merged)" if base is not None else ""))
  if lora:
    out = os.path.join(workdir, "peft_adapter")
    lo = config.lora
    with files.local_folder(out) as folder:
      export_peft_adapter(params, model_cfg, folder, rank=lo.rank, alpha=lo.alpha,
                          use_rslora=lo.use_rslora, base_model=config.model.path)
    log(f"exported the LoRA adapters in PEFT's format: {out}")
