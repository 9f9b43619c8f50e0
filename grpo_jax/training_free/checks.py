"""The checks Training-Free GRPO runs on its config before any compute: every stage's
(grpo_jax/config.py `validate`, which also imports config.imports) and its own tfgrpo section's.
Each failure is one ConfigError (InputError for a missing folder) naming the value and the fix.
"""

from __future__ import annotations

import os
import string

from grpo_jax import config as config_lib
from grpo_jax.errors import ConfigError, InputError, first_line

# The fields the loop fills in each template of tfgrpo.prompts (training_free/loop.py), with a
# value of the type the loop gives each in the trial fill, so that a format spec or conversion
# the check accepts also fills in at the first step: max_operations is a number; batch_update's
# experiences the candidate library (a dict, id -> lesson) and updates the modify operations
# waiting (a list of dicts); the rest text.
TEMPLATE_FIELDS = {
    "problem": {"problem": "x", "experiences": "x"},
    "summary": {"trajectory": "x", "grade": "x", "answer": "x"},
    "critique": {"max_operations": 1, "problem": "x", "trajectories": "x", "answer": "x",
                 "experiences": "x"},
    "batch_update": {"experiences": {"G0": "x", "C0": "x"},
                     "updates": [{"option": "modify", "experience": "x", "modified_from": "G0"}]},
}
REQUIRED_FIELDS = {"problem": ("problem",)}  # without it the policy never sees the question


def check_template(name: str, template) -> None:
  """ConfigError when tfgrpo.prompts.<name> is not a string, names a field the loop does not
  fill (a KeyError at the first step that uses it), lacks a required one, or cannot be filled
  in (a stray brace, a format spec that does not fit)."""
  fields = TEMPLATE_FIELDS[name]
  listed = ", ".join(f"{{{f}}}" for f in fields)
  if not isinstance(template, str):
    raise ConfigError(f"tfgrpo.prompts.{name}={template!r}; give a template string using "
                      f"{listed}.")
  try:
    used = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
  except ValueError as e:
    raise ConfigError(f"tfgrpo.prompts.{name} is not a valid template ({e}); write a literal "
                      f"brace as {{{{ or }}}}.") from None
  unknown = [field for field in used if field not in fields]
  if unknown:
    raise ConfigError(f"tfgrpo.prompts.{name} names the field {{{unknown[0]}}}, which this "
                      f"stage does not fill in; use only {listed}, and write a literal brace as "
                      f"{{{{ or }}}}.")
  missing = [field for field in REQUIRED_FIELDS.get(name, ()) if field not in used]
  if missing:
    raise ConfigError(f"tfgrpo.prompts.{name} lacks {{{missing[0]}}}, so the policy would "
                      f"never see the question; put {{{missing[0]}}} where it goes.")
  try:
    template.format(**fields)
  except (ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
    kinds = {int: "a number", dict: "a dict", list: "a list"}
    types = " and ".join(f"{{{f}}} is {kinds[type(v)]}" for f, v in fields.items()
                         if not isinstance(v, str))
    raise ConfigError(f"tfgrpo.prompts.{name} cannot be filled in ({first_line(e)}); fix "
                      f"that template's fields ({listed}{'; ' + types if types else ''})."
                      ) from None


def check_training_free_config(config) -> None:
  """Every check of this stage's config (module docstring), before any compute."""
  if "tfgrpo" not in config:
    raise ConfigError("the config has no tfgrpo section; start from "
                      "configs/training_free_grpo_smollm2.py, which defines it.")
  t = config.tfgrpo
  for name, least in (("steps", 0), ("batch_size", 1), ("summary_max_new_tokens", 1),
                      ("chat_batch_size", 1)):
    value = t.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
      raise ConfigError(f"tfgrpo.{name}={value!r}; use a whole number >= {least}.")
  if config.rollout.group_size < 2:
    raise ConfigError(f"rollout.group_size={config.rollout.group_size}: a step compares the "
                      f"completions of a problem; use >= 2 (the authors use 5).")
  if not isinstance(t.get("seed_library"), str):
    raise ConfigError(f"tfgrpo.seed_library={t.get('seed_library')!r}; give a string, one "
                      f"lesson a line ('' for an empty library).")
  path = t.get("summariser_path")
  if not isinstance(path, str) or (path and not os.path.isfile(os.path.join(path,
                                                                           "config.json"))):
    raise InputError(f"tfgrpo.summariser_path={path!r} is not a Hugging Face model folder (no "
                     f"config.json); give one, or '' for the policy as its own summariser.")
  prompts = t.get("prompts")
  for name in TEMPLATE_FIELDS:
    check_template(name, prompts.get(name) if hasattr(prompts, "get") else None)
  config_lib.validate(config)  # every stage's checks; it imports config.imports first
