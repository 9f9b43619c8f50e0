"""Evaluation alone: python -m grpo_jax.eval --config=configs/<name>.py --workdir=DIR
[--config.model.path=CKPT] [--config.train.eval_pass_k=K]

Evaluates the policy at config.model.path (for example a run's `hf_export/`) on the task's
held-out split, prints its progress and the figures, and writes DIR/eval.json and
DIR/samples.jsonl (the first train.num_samples prompts' greedy completions, scored; none
with 0).
"""

from __future__ import annotations

import json
import time

import jax

from grpo_jax import config as config_lib
from grpo_jax.errors import RunStopped
from grpo_jax.main import _CONFIG, _WORKDIR, _fail, check_flags, quiet_library_logs, start


def main(argv):
  del argv
  from grpo_jax.host_allocator import tune_host_allocator
  tune_host_allocator()  # before JAX starts its threads (see the module)
  from grpo_jax.parallel.platform import check_xla_flags, start_backend
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
    start_backend(config.train.compilation_cache)
    config_lib.validate(config)
    check_workdir(_WORKDIR.value, checkpoints=False)
    check_not_a_run(_WORKDIR.value)
    task = build_task(config)
    key = jax.random.key(config.seed)
    evaluation = EvalSection.of(config)
    model_cfg, params = build_model(ModelSection.of(config), jax.random.fold_in(key, 0))
    check_task_fits_model(model_cfg, task, evaluation.eval_size,
                          evaluation.rollout.max_new_tokens)
  except config_lib.ConfigError as e:
    _fail(e, 2)
  samples = []
  start = time.perf_counter()
  try:
    metrics = evaluate(params, task, model_cfg, evaluation, jax.random.fold_in(key, 3),
                       samples_out=samples, progress=lambda done, total: print(
                           f"eval: {done}/{total} prompts, {time.perf_counter() - start:.0f} s",
                           flush=True))
  except RunStopped as e:  # a reward that raises or is not finite (train.on_reward_error)
    _fail(e, 1)
  from grpo_jax.train.run import files  # noqa: PLC0415
  files.makedirs(_WORKDIR.value)
  files.write_atomic(files.path(_WORKDIR.value, "eval.json"), json.dumps(metrics, indent=2))
  shown = samples[0] if samples else []  # none with train.num_samples=0
  if shown:
    files.write_atomic(files.path(_WORKDIR.value, "samples.jsonl"),
                       "".join(json.dumps(dict(s, step=0)) + "\n" for s in shown))
  for line in format_samples(shown, limit=len(shown)):
    print(line)
  for name, value in metrics.items():
    print(f"{name}: {value:.4f}")


if __name__ == "__main__":  # (the flags are those of grpo_jax.main)
  start(main)
