"""samples.jsonl of the pure-JAX episodes source (train.experience_source="fused_episodes",
grpo_jax/train/sources/fused_episodes.py): whole episodes, turn by turn, with which ids were
trained, the same records the host "episodes" source writes at the same seed and step (the two
play identical episodes: tests/test_env_jax.py), and the run's metrics unchanged by them."""

import json

import numpy as np

from configs import grpo_calculator_tiny
from grpo_jax.train.stages.rl import train


def _run(workdir, source: str, num_samples: int = 2):
  """configs/grpo_calculator_tiny.py cut to 2 steps (both in one scan for the fused source):
  (metrics records, train sample records)."""
  c = grpo_calculator_tiny.get_config()
  c.train.experience_source = source
  c.train.fused_steps = 2 if source == "fused_episodes" else 0
  c.warmup.steps, c.warmup.batch_size = 2, 8
  c.model.num_layers = 1
  c.train.steps, c.train.eval_every, c.train.checkpoint_every = 2, 2, 0
  c.train.eval_size = c.train.eval_batch_size = 4
  c.rollout.num_prompts, c.rollout.group_size = 2, 4
  c.train.num_samples = num_samples
  train(c, str(workdir), log=lambda *a, **k: None)
  records = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  path = workdir / "samples.jsonl"
  samples = [json.loads(line) for line in open(path)] if path.exists() else []
  return records, [s for s in samples if s["split"] == "train"]


def _numbers(records):
  """The records without wall-clock timings."""
  return [{k: v for k, v in r.items() if not k.startswith(("time_", "step_time_s",
                                                           "tokens_per_s", "elapsed_s"))}
          for r in records]


def test_fused_episodes_write_the_host_sources_episode_samples(tmp_path):
  records, samples = _run(tmp_path / "fused", "fused_episodes")
  # Step 2 is due (train.samples_every=0: every evaluation, and the last step): the first
  # episode of each of the 2 groups.
  assert [(s["step"], s["split"]) for s in samples] == [(2, "train")] * 2
  last = records[-1]
  for s in samples:
    assert s["completion"] == "".join(t["text"] for t in s["turns"])
    flags = [t["trained"] for t in s["turns"]]
    assert flags[0] and all(a != b for a, b in zip(flags, flags[1:])), flags
    assert s["turns"][-1]["text"].endswith("<|im_end|>")  # the turn's end: the environment's
    assert s["reward"] in (0.0, 1.0) and s["correct"] == s["reward"]
  # Their rewards are some of the step's 8 rows' (reward_mean is over all 8).
  assert sum(s["reward"] for s in samples) <= 8 * last["reward_mean"] + 1e-6
  # The host source plays the same episodes at the same seed and step: the same records.
  _, host_samples = _run(tmp_path / "host", "episodes")
  assert samples == host_samples
  # The samples are extra outputs of the scan: no metric moves without them.
  quiet, none = _run(tmp_path / "quiet", "fused_episodes", num_samples=0)
  assert none == []
  assert _numbers(quiet) == _numbers(records)
  assert np.isfinite(last["loss"])
