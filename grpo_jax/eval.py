"""Evaluation alone: python -m grpo_jax.eval --config=configs/<name>.py --workdir=DIR
[--config.model.path=CKPT] [--config.train.eval_pass_k=K]

Evaluates the policy at config.model.path (for example a run's `hf_export/`) on the task's
held-out split, prints its progress and the figures, and writes DIR/eval.json and
DIR/samples.jsonl (the first train.num_samples prompts' greedy completions, scored; none
with 0, and an earlier evaluation's file is removed). Devices start as the RL stage's do
(distributed.*, then config.mesh: the evaluation runs on the mesh the RL stage evaluates on,
the learner's), the params placed on it; process 0 prints and writes.
"""

from __future__ import annotations

import json
import time

import jax

from grpo_jax import config as config_lib
from grpo_jax.errors import RunStopped
from grpo_jax.main import _CONFIG, _WORKDIR, _fail, check_flags, quiet_library_logs, start
from grpo_jax.parallel import distributed


def start_devices(config):
  """The RL stage's evaluation mesh (the learner's) of config.mesh, after
  distributed.initialize and the backend's start, as that stage starts them; a mesh these
  devices cannot make is one ConfigError sentence."""
  from grpo_jax.parallel.mesh import role_meshes  # noqa: PLC0415
  from grpo_jax.parallel.platform import start_backend  # noqa: PLC0415
  from grpo_jax.train.run.sections import DeviceSection  # noqa: PLC0415
  devices = DeviceSection.of(config)
  distributed.initialize(devices.distributed)
  start_backend(devices.compilation_cache)
  try:
    return role_meshes(devices.mesh, int(devices.mesh.get("rollout_devices", 0)))[0]
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None


def main(argv):
  del argv
  from grpo_jax.host_allocator import tune_host_allocator
  tune_host_allocator()  # before JAX starts its threads (see the module)
  from grpo_jax.models.partitioning import place
  from grpo_jax.parallel.platform import check_xla_flags
  from grpo_jax.train.run.evaluation import evaluate
  from grpo_jax.train.run.samples import format_samples
  from grpo_jax.train.run.sections import EvalSection, ModelSection
  from grpo_jax.train.run.setup import build_model, build_task, check_task_fits_model
  from grpo_jax.train.run.workdir import check_not_a_run, check_workdir
  quiet_library_logs()
  check_flags()
  config = _CONFIG.value
  try:
    check_xla_flags()  # before this process starts XLA, which aborts on a flag it rejects
    config_lib.validate(config)
    mesh = start_devices(config)
    check_workdir(_WORKDIR.value, checkpoints=False)
    check_not_a_run(_WORKDIR.value)
    task = build_task(config)
    key = jax.random.key(config.seed)
    evaluation = EvalSection.of(config)
    model_cfg, params = build_model(ModelSection.of(config), jax.random.fold_in(key, 0), task)
    check_task_fits_model(model_cfg, task, evaluation.eval_size,
                          evaluation.rollout.max_new_tokens)
  except config_lib.ConfigError as e:
    _fail(e, 2)
  main_process = distributed.is_main_process()
  log = print if main_process else lambda *a, **k: None
  samples = []
  start = time.perf_counter()
  try:
    with jax.set_mesh(mesh):  # the model's activation constraints, as in training
      metrics = evaluate(place(params, mesh), task, model_cfg, evaluation,
                         jax.random.fold_in(key, 3), mesh, samples_out=samples,
                         progress=lambda done, total: log(
                             f"eval: {done}/{total} prompts, {time.perf_counter() - start:.0f} s",
                             flush=True))
  except RunStopped as e:  # a reward that raises or is not finite (train.on_reward_error)
    _fail(e, 1)
  if not main_process:
    return
  from grpo_jax.train.run import files  # noqa: PLC0415
  files.makedirs(_WORKDIR.value)
  files.write_atomic(files.path(_WORKDIR.value, "eval.json"), json.dumps(metrics, indent=2))
  shown = samples[0] if samples else []  # none with train.num_samples=0
  samples_file = files.path(_WORKDIR.value, "samples.jsonl")
  if shown:
    files.write_atomic(samples_file,
                       "".join(json.dumps(dict(s, step=0)) + "\n" for s in shown))
  else:  # not an earlier evaluation's samples beside these figures
    samples_file.unlink(missing_ok=True)
  for line in format_samples(shown, limit=len(shown)):
    print(line)
  for name, value in metrics.items():
    print(f"{name}: {value:.4f}")


if __name__ == "__main__":  # (the flags are those of grpo_jax.main)
  start(main)
