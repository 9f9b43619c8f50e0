"""The end of a model.path run: the trained policy as a Hugging Face checkpoint and, under LoRA,
its adapters in PEFT's format (grpo_jax/models/hf_export.py); for stacked seeds, each seed's in
its own folder."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil

import jax

from grpo_jax.errors import ConfigError, RunStopped, first_line
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.lora import LoraParams, merge
from grpo_jax.models.vision.policy import vlm_policy_params
from grpo_jax.parallel import distributed
from grpo_jax.train.run import files
from grpo_jax.train.run.sections import ModelSection


def export_model_type(model: ModelSection, model_cfg) -> str:
  """The model_type an exported folder gets: model.path's, else the family of the features."""
  if model.uses_checkpoint:
    return json.loads((pathlib.Path(model.path) / "config.json").read_text())["model_type"]
  return model_cfg.blocks.export_model_type(model_cfg)


SETTINGS_FILE = "grpo_jax_export.json"  # in hf_export: the settings it was written with


def _settings(model: ModelSection) -> dict:
  return {"dtype": model.export_dtype, "max_shard_bytes": model.export_max_shard_bytes}


def export_is_current(workdir: str, model: ModelSection) -> bool:
  """Whether workdir/hf_export holds an export written with today's train.export_dtype and
  train.export_max_shard_mb (a finished run run again exports again only if not; an export
  without the settings file, from an older version, is kept)."""
  folder = files.path(workdir, "hf_export")
  if not files.exists(folder / "config.json"):
    return False
  try:
    text = files.read_text(folder / SETTINGS_FILE)
    return text is None or json.loads(text) == _settings(model)
  except ValueError:
    return False


@contextlib.contextmanager
def writing_export(out: str, model: ModelSection):
  """A local folder to write the export `out` into (files.local_folder), its failure one
  sentence, and its settings recorded beside it when it is written."""
  with _export_failure_is_one_sentence(out), files.local_folder(out) as folder:
    yield folder
    with open(os.path.join(folder, SETTINGS_FILE), "w") as f:
      json.dump(_settings(model), f)


@contextlib.contextmanager
def _export_failure_is_one_sentence(out: str):
  """A write that fails (a full disk, a folder that cannot be written): one RunStopped sentence;
  the checkpoints are written before the export, so a rerun exports again from the last one."""
  try:
    yield
  except ConfigError:
    raise
  except Exception as e:  # noqa: BLE001  safetensors' own SafetensorError on a full disk
    shutil.rmtree(out, ignore_errors=True)  # no half-written checkpoint left to be loaded
    raise RunStopped(f"writing the export {out} failed ({first_line(e)}); the run's checkpoints "
                     f"are intact: free space (or fix the folder) and run the same command "
                     f"again, which exports from the last checkpoint.") from None


def export_policy(model: ModelSection, state, model_cfg: ModelConfig, workdir: str, log,
                  export: bool | None = None) -> None:
  """train.export (model.export, or `export`, a stage's own switch): the policy as a full HF
  checkpoint in workdir/hf_export (under LoRA the adapters merged into the base);
  lora.export_adapter (LoRA only): the adapters in PEFT's format in workdir/peft_adapter."""
  lo = model.lora
  lora = lo is not None and lo.export_adapter and model.uses_checkpoint
  export = model.export if export is None else export
  if not (export or lora):
    return
  # Collective: every process takes part.
  host = distributed.to_host((state.params, state.base_params))
  if not distributed.is_main_process():
    return
  from grpo_jax.models.hf_export import (export_hf_checkpoint, export_peft_adapter,  # noqa
                                         export_vlm_checkpoint)
  params, base = host
  vlm = hasattr(model_cfg, "vision")  # a vision-language policy: {"vision", "text"} params
  if export:
    out = os.path.join(workdir, "hf_export")
    with jax.default_device(jax.devices("cpu")[0]):  # the accelerators still hold the state
      full = params if base is None else (
          vlm_policy_params(LoraParams(base, params), model_cfg) if vlm
          else merge(base, params, model_cfg.lora_scale))
    with writing_export(out, model) as folder:
      if vlm:
        export_vlm_checkpoint(full, model_cfg, folder, source_dir=model.path or None,
                              dtype=model.export_dtype,
                              max_shard_bytes=model.export_max_shard_bytes)
      else:
        export_hf_checkpoint(full, model_cfg, folder, source_dir=model.path or None,
                             model_type=export_model_type(model, model_cfg),
                             dtype=model.export_dtype,
                             max_shard_bytes=model.export_max_shard_bytes)
    log(f"exported the trained policy as a Hugging Face checkpoint ({model.export_dtype}): {out}"
        + (" (LoRA adapters merged)" if base is not None else ""))
  if lora:
    out = os.path.join(workdir, "peft_adapter")
    with _export_failure_is_one_sentence(out), files.local_folder(out) as folder:
      if vlm:  # the decoder's adapters (the tower, when trained, is not an adapter)
        export_peft_adapter(params["text"], model_cfg.text, folder, rank=lo.rank,
                            alpha=lo.alpha, use_rslora=lo.use_rslora, base_model=model.path,
                            layers_prefix="base_model.model.model.language_model.layers")
      else:
        export_peft_adapter(params, model_cfg, folder, rank=lo.rank, alpha=lo.alpha,
                            use_rslora=lo.use_rslora, base_model=model.path)
    log(f"exported the LoRA adapters in PEFT's format: {out}")


def export_seeds(model: ModelSection, state, model_cfg: ModelConfig, workdirs, axis, log,
                 finished: bool) -> None:
  """export_policy of each seed of an RL run (`axis`, a SeedAxis) into its workdir: one seed's
  state as it is, stacked seeds' slices (params and the LoRA base) into workdir/seed_<s>. A
  finished run run again leaves a folder whose hf_export is written as it is."""
  if axis.stacked:
    states = [state.replace(params=p, base_params=b)
              for p, b in axis.unstack((state.params, state.base_params))]
  else:
    states = [state]
  for wd, one in zip(workdirs, states):
    if not (finished and export_is_current(wd, model)):
      export_policy(model, one, model_cfg, wd, log)
