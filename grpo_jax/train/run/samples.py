"""Seeing the model: sample completions as text, written to workdir/samples.jsonl.

Each line is {"step", "split" ("train" or "eval"), "prompt", "completion", "reward",
"correct"}: training samples are the first completions of a step's first prompts with their
rewards; evaluation samples are the greedy completions of the first held-out prompts with the
task's reward and its eval_accuracy score as "correct". Training writes them every
train.samples_every steps (and at every evaluation), prints a few, and logs them to TensorBoard
and W&B as text when those are on; `python -m grpo_jax.eval` writes them beside eval.json.
"""

from __future__ import annotations

import json

import numpy as np

from grpo_jax.prompt_batch import concat_batches, take_rows
from grpo_jax.train.run import files


def describe(task, batch, rows, completion_tokens, completion_mask, rewards, split: str,
             step: int) -> list[dict]:
  """Sample records of completions (one per prompt row of `batch` in `rows`): text, reward
  and the task's eval_accuracy score of that completion as "correct"."""
  prompts = take_rows(batch, list(rows))
  tokens, mask = np.asarray(completion_tokens), np.asarray(completion_mask)
  correct = task.eval_scores(prompts, tokens, mask)["eval_accuracy"]
  return [dict(step=int(step), split=split, prompt=p, completion=c, reward=float(r),
               correct=float(k))
          for p, c, r, k in zip(task.prompt_texts(prompts), task.decode(tokens, mask),
                                np.asarray(rewards), correct)]


def samples_due(t_cfg, step: int) -> bool:
  """Whether step writes sample completions: every train.samples_every steps (0: at every
  evaluation) and at the last step."""
  every = t_cfg.samples_every or t_cfg.eval_every
  return t_cfg.num_samples > 0 and (step % every == 0 or step == t_cfg.steps)


def train_samples(task, collected, group_size: int, step: int, count: int) -> list[dict]:
  """The first completion of each of a step's first `count` groups (a `Collected`), scored in
  one call of the task (the same shapes as the evaluation's samples: nothing new to compile)."""
  groups = collected.group_prompts[:count]
  if not groups:
    return []
  batch = concat_batches([take_rows(b, [row]) for b, row in groups])
  first = np.arange(len(groups)) * group_size
  return describe(task, batch, range(len(groups)),
                  np.asarray(collected.rollout.completion_tokens)[first],
                  np.asarray(collected.rollout.completion_mask)[first],
                  np.asarray(collected.inputs.rewards)[first], "train", step)


def format_samples(samples: list[dict], limit: int = 2, width: int = 100) -> list[str]:
  """A few console lines: the prompt's end, the completion and its reward."""
  def short(text):
    text = " ".join(text.split())
    return text if len(text) <= width else "..." + text[-width + 3:]
  return [f"  [{s['split']}] {short(s['prompt'])!r} -> {short(s['completion'])!r} "
          f"(reward {s['reward']:.2f}, correct {s['correct']:.0f})" for s in samples[:limit]]


class SamplesWriter:
  """Appends sample records to workdir/samples.jsonl (and TensorBoard / W&B text)."""

  def __init__(self, workdir: str, enabled: bool = True, metrics_writer=None):
    self.path = files.path(workdir, "samples.jsonl")
    self.enabled = enabled
    self._metrics = metrics_writer

  def write(self, samples: list[dict]) -> None:
    if not self.enabled or not samples:
      return
    files.append(self.path, "".join(json.dumps(s) + "\n" for s in samples))
    if self._metrics is not None:
      self._metrics.write_text(samples[0]["step"], f"samples/{samples[0]['split']}",
                               "\n\n".join(f"{s['prompt']}\n-> {s['completion']} (reward "
                                           f"{s['reward']:.2f})" for s in samples))
