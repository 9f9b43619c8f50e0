"""An experience source written outside the package, loaded by config.imports
(tests/test_experience_source.py): each call samples with the current policy through the host
source and hands the learner the rollout of the previous call (the first call: its own), so
rows reach the update one policy version late. It declares max_staleness=1; the run then
computes the old log-probs instead of reusing the update's own.

    --config.imports=tests/plugins/one_step_stale_source.py
    --config.train.experience_source=one_step_stale

The pending rollout lives in this process (a resumed run samples it again): a source whose
in-flight rows must survive a restart keeps them in SourceState.in_flight.
"""

from grpo_jax.train.sources.experience_source import EXPERIENCE_SOURCES, register_experience_source


@register_experience_source("one_step_stale", max_staleness=1, replace=True)
def make_one_step_stale(run, state, samples_out):
  fresh = EXPERIENCE_SOURCES.get("host").make(run, state, samples_out)
  sampled = []  # the previous call's experience, then this call's

  def next_experience(train_state, source):
    source, experience = fresh(train_state, source)
    sampled.append(experience)
    return source, sampled.pop(0) if len(sampled) > 1 else sampled[0]

  return next_experience
