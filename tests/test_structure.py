"""The package's import structure: no circles between modules, and the floors of grpo_jax/
(its subpackages and top-level modules) in an order where every import points down.

Every import counts, also those inside functions (an import deferred to break a circle is still
the circle). Floors, bottom first, are listed in FLOORS; a new subpackage or top-level module
must be given one.
"""

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "grpo_jax")

# Bottom first. A unit may import its own floor's units only where no circle results (the
# module graph is checked for circles separately), and any unit of a lower floor.
FLOORS = [
    ["errors", "console", "host_allocator", "prompt_batch", "compile_log", "interrupts",
     "unicode_text"],
    ["registry", "parallel"],
    ["models", "rl"],
    ["rollout", "rewards", "fetch_model", "envs", "teacher_http"],
    ["data"],
    ["builtins"],
    ["config", "config_checks", "config_docs"],
    ["defaults", "objective_defaults"],
    ["train"],
    ["training_free"],
    ["stages"],
    # sweep: launch/sweep.py's library; it checks each arm's config as its program will
    ["main", "eval", "serve_teacher", "train_dpo", "train_rm", "train_sft", "train_training_free",
     "sweep"],
]


def _modules() -> dict:
  """Module name (grpo_jax.x.y) -> path."""
  out = {}
  for folder, _, files in os.walk(ROOT):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
        out[rel.removesuffix(".__init__")] = path
  return out


def _imports(path: str, modules: dict) -> set:
  """The grpo_jax modules a file imports, anywhere in it (functions included)."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
      if name in modules and name.startswith("grpo_jax."):
        found.add(name)
  return found


def _graph():
  modules = _modules()
  return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def _unit(module: str) -> str:
  return module.split(".")[1] if module.count(".") >= 1 else module


def test_every_unit_has_a_floor():
  floors = {u for floor in FLOORS for u in floor}
  units = {_unit(m) for m in _modules() if m != "grpo_jax"}
  assert units - floors == set(), f"give these a floor in FLOORS: {sorted(units - floors)}"


def test_imports_point_down():
  floor_of = {u: i for i, floor in enumerate(FLOORS) for u in floor}
  up = sorted(f"{m} -> {d}" for m, deps in _graph().items() if m != "grpo_jax"
              for d in deps if floor_of[_unit(d)] > floor_of[_unit(m)])
  assert up == [], "imports pointing up a floor:\n" + "\n".join(up)


def test_no_circles():
  graph = _graph()
  state, circles = {}, []

  def visit(m, path):
    state[m] = "open"
    for d in sorted(graph[m]):
      if state.get(d) == "open":
        circles.append(" -> ".join(path[path.index(d):] + [d]))
      elif d not in state:
        visit(d, path + [d])
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m, [m])
  assert circles == [], "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("unit_a,unit_b", [("rewards", "train"), ("config", "train"),
                                           ("rollout", "train"), ("rewards", "models")])
def test_named_regressions(unit_a, unit_b):
  """The two upward imports and the circle issue 30 found stay gone, and rewards/ imports no
  model code (model-backed rewards are loaded in grpo_jax/train/run/reward_models.py)."""
  graph = _graph()
  assert not any(_unit(d) == unit_b for m, deps in graph.items() if _unit(m) == unit_a
                 for d in deps)


TRAIN_ROOMS = ["learner", "run", "sources", "stages"]  # grpo_jax/train/'s rooms, bottom first


def test_train_rooms_import_down():
  """grpo_jax/train/ is four rooms (docs/architecture.md): the learner's maths, the run's
  infrastructure, the experience sources, the stages; an import between them points down."""
  def room(module):
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "train" else None
  graph = _graph()
  assert {room(m) for m in graph} - {None} == set(TRAIN_ROOMS)
  up = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
              if room(m) and room(d) and TRAIN_ROOMS.index(room(d)) > TRAIN_ROOMS.index(room(m)))
  assert up == [], "imports pointing up a room of train/:\n" + "\n".join(up)


def _architecture_block(tag: str) -> str:
  text = open(os.path.join(os.path.dirname(ROOT), "docs", "architecture.md")).read()
  return text.split(f"<!-- {tag}: begin -->")[1].split(f"<!-- {tag}: end -->")[0]


def test_the_architecture_page_lists_these_floors():
  listed = [line.split(". ", 1)[1].split(", ") for line in
            _architecture_block("floors").strip().strip("`").strip().splitlines()]
  assert listed == FLOORS, "docs/architecture.md's floors differ from FLOORS"


def test_the_architecture_page_names_every_module():
  block, missing, folder = _architecture_block("every file"), [], None
  named = set()
  for line in block.splitlines():
    if line.startswith("grpo_jax"):
      folder = line.strip().rstrip("/")
    elif line.startswith("  ") and folder:
      named.add(f"{folder}/{line.split()[0]}")
  for path in _modules().values():
    rel = os.path.relpath(path, os.path.dirname(ROOT)).replace(os.sep, "/")
    if rel not in named:
      missing.append(rel)
  assert missing == [], f"docs/architecture.md's 'Every file' lacks: {missing}"
