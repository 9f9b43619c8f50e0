"""Training-Free GRPO's checks before any compute (training_free/checks.py) and its resume from
damaged or stray library files (training_free/library_files.py), by direct calls."""

import json

import pytest

from configs import training_free_grpo_smollm2 as recipe
from grpo_jax.errors import ConfigError, InputError
from grpo_jax.training_free.checks import check_training_free_config
from grpo_jax.training_free.library_files import LibraryFiles, LibraryState
from grpo_jax.training_free.loop import train_training_free
from tests.fixtures import with_fields


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
  """A folder: the checks ask no more of model.path (the model loader reads it, later)."""
  return str(tmp_path_factory.mktemp("model"))


def _config(model_path, **changes):
  c = recipe.get_config()
  c.model.path = model_path
  c.rollout.update(dict(group_size=3, max_new_tokens=4))
  return with_fields(c, {k.replace("__", "."): v for k, v in changes.items()})


def test_the_recipe_passes(model_path):
  check_training_free_config(_config(model_path))


@pytest.mark.parametrize("changes, words", [
    (dict(tfgrpo__steps=-3), r"tfgrpo.steps=-3; use a whole number >= 0"),  # L06
    (dict(tfgrpo__batch_size=0), r"tfgrpo.batch_size=0; use a whole number >= 1"),
    (dict(rollout__temperature=-1.0), r"rollout.temperature=-1.0; use >= 0"),  # L07
    (dict(rollout__group_size=1), r"rollout.group_size=1.* use >= 2"),
    (dict(tfgrpo__prompts__problem="{problem} {nope}"),  # L05
     r"tfgrpo.prompts.problem names the field \{nope\}, .* use only \{problem\}, \{experiences\}"),
    (dict(tfgrpo__prompts__critique="{max_operations} {problem} {0}"),
     r"tfgrpo.prompts.critique names the field \{0\}"),
    (dict(tfgrpo__prompts__summary="{trajectory} {grade"), r"prompts.summary is not a valid"),
    (dict(tfgrpo__prompts__batch_update="{updates:d}"), r"prompts.batch_update cannot be filled"),
    # The loop fills {experiences} with a dict: a spec that only a string takes is refused here,
    # not a TypeError at the first step.
    (dict(tfgrpo__prompts__batch_update="{experiences:.2000} {updates}"),
     r"prompts.batch_update cannot be filled in .*dict.* \{experiences\} is a dict"),
    (dict(tfgrpo__prompts__batch_update="{experiences} {updates:>10}"),
     r"prompts.batch_update cannot be filled in .*list"),
    (dict(tfgrpo__prompts__problem="Solve it. {experiences}"), r"lacks \{problem\}"),
    (dict(tfgrpo__summariser_path="/no/such/folder"), r"summariser_path='/no/such/folder' is not"),
])
def test_bad_values_are_one_sentence(model_path, changes, words):
  with pytest.raises(ConfigError, match=words):
    check_training_free_config(_config(model_path, **changes))


def test_imports_are_loaded_and_the_section_required(model_path, tmp_path):  # L08
  plugin = tmp_path / "raises.py"
  plugin.write_text('raise RuntimeError("plugin boom")\n')
  with pytest.raises(ConfigError, match=r"raises.py raised RuntimeError: plugin boom"):
    check_training_free_config(_config(model_path, imports=str(plugin)))
  no_section = _config(model_path)
  del no_section["tfgrpo"]
  with pytest.raises(ConfigError, match="no tfgrpo section"):
    check_training_free_config(no_section)


def test_the_stage_checks_before_writing_anything(model_path, tmp_path):
  with pytest.raises(ConfigError, match="tfgrpo.steps=-3"):
    train_training_free(_config(model_path, tfgrpo__steps=-3), str(tmp_path / "run"),
                        chat=lambda m: m, log=lambda *a: None)
  assert not (tmp_path / "run").exists()


def test_resume_falls_back_past_damaged_library_files(tmp_path):  # L01-L03
  files = LibraryFiles(str(tmp_path))
  for step in (0, 1):
    files.save(LibraryState(step, {"G0": f"lesson {step}"}))
  folder = tmp_path / "library"
  (folder / "step_2.json").write_text('{"step": 2, "libr')  # cut short
  (folder / "step_3.json").write_text(json.dumps({"step": 3, "library": ["a", "b"]}))
  (folder / "step_4.json").write_text(json.dumps({"step": 9, "library": {}}))  # another step's
  (folder / "step_notes.json").write_text("{}")  # not library files: ignored
  (folder / "step_07.json").write_text("{}")
  (folder / "step_2.json.unreadable").write_text("older")
  assert files.steps() == [0, 1, 2, 3, 4]
  state, damaged = files.newest()
  assert state == LibraryState(1, {"G0": "lesson 1"})
  assert [d.step for d in damaged] == [4, 3, 2]
  assert "Unterminated string" in damaged[2].reason
  said = []
  files.set_aside(damaged, state.step, log=said.append)
  assert files.steps() == [0, 1] and (folder / "step_2.json.unreadable1").exists()
  assert (folder / "step_3.json.unreadable").exists() and (folder / "step_notes.json").exists()
  assert said[2].startswith(f"warning: {folder}/step_2.json cannot be read as a library "
                            f"(JSONDecodeError: Unterminated string")
  assert said[2].endswith("resuming from step_1.json, and it was moved to "
                          "step_2.json.unreadable1.")
  for step in (0, 1):
    (folder / f"step_{step}.json").write_text("not json")
  with pytest.raises(InputError, match=r"library/step_1.json cannot be read as a library "
                                       r"\(JSONDecodeError: .*\), nor can any older step file"):
    files.newest()
  assert LibraryFiles(str(tmp_path / "fresh")).newest() == (None, [])
