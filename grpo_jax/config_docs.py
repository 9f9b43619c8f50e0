"""`python -m grpo_jax.main --config=X --print_config`: the resolved config, one field a line,
each with its one-line doc: the comment that stands beside or above the field in
grpo_jax/defaults.py, the one place where every default lives (and grpo_jax/objective_defaults.py,
the rl and dpo sections it calls)."""

from __future__ import annotations

import ast
import io
import os
import tokenize

DEFAULTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "defaults.py")
SECTIONS_FILE = os.path.join(os.path.dirname(DEFAULTS_FILE), "objective_defaults.py")
# The functions of objective_defaults.py that build one section from a `section = dict(...)`.
SECTION_FUNCTIONS = {"rl_defaults": "rl", "dpo_defaults": "dpo"}
DOC_WIDTH = 110


def _comments(source: str) -> dict[int, str]:
  """{line number: the comment's text} of every comment in `source`."""
  return {tok.start[0]: tok.string.lstrip("#").strip()
          for tok in tokenize.generate_tokens(io.StringIO(source).readline)
          if tok.type == tokenize.COMMENT}


def _dict_calls(node):
  """The outermost dict(...) calls inside `node`."""
  if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
    yield node
    return
  for child in ast.iter_child_nodes(node):
    yield from _dict_calls(child)


def _fields(call: ast.Call, prefix: str):
  """(dotted path, line) of each keyword of a dict(...) call, nested sections included."""
  for kw in call.keywords:
    if kw.arg is None:
      continue
    path = f"{prefix}.{kw.arg}"
    yield path, kw.lineno
    for inner in _dict_calls(kw.value):
      yield from _fields(inner, path)


def _field_lines(tree: ast.Module):
  for node in ast.walk(tree):
    if isinstance(node, ast.FunctionDef) and node.name in SECTION_FUNCTIONS:
      for stmt in ast.walk(node):
        if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", None) == "section":
          for call in _dict_calls(stmt.value):
            yield from _fields(call, SECTION_FUNCTIONS[node.name])
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute) and \
        getattr(node.targets[0].value, "id", None) == "c":
      name = node.targets[0].attr
      yield name, node.lineno
      for call in _dict_calls(node.value):
        yield from _fields(call, name)


def field_docs(path: str = DEFAULTS_FILE) -> dict[str, str]:
  """{dotted field: its doc}: the comment on the field's line, else the comment lines just
  above it (a field sharing a line or a block with others shares their doc)."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  comments, lines = _comments(source), source.splitlines()
  docs = {}
  for field, line in _field_lines(ast.parse(source)):
    text = comments.get(line)
    if text is None:
      block, above = [], line - 1
      while above in comments and lines[above - 1].lstrip().startswith("#"):
        block.insert(0, comments[above])
        above -= 1
      text = " ".join(block)
    if text:
      docs[field] = text
  return docs


def _flatten(config, prefix: str = ""):
  for key, value in config.items():
    path = f"{prefix}{key}"
    if hasattr(value, "items") and not isinstance(value, dict):  # a ConfigDict section
      yield from _flatten(value, path + ".")
    else:
      yield path, value


def describe(config) -> str:
  """Every field of the resolved `config` as `field = value  # doc`, in its sections."""
  docs = {**field_docs(SECTIONS_FILE), **field_docs()}
  rows = sorted(_flatten(config), key=lambda row: ("." in row[0], row[0]))  # top level first
  width = min(max(len(f"{p} = {v!r}") for p, v in rows), 60)
  out, section = [], None
  for path, value in rows:
    head = path.split(".")[0] if "." in path else ""
    if head != section:
      section = head
      out.append(f"\n[{head}]" if head else "[top level]")
    doc = docs.get(path, "")
    if len(doc) > DOC_WIDTH:
      doc = doc[:DOC_WIDTH - 3].rstrip() + "..."
    text = f"{path} = {value!r}"
    out.append(f"{text:<{width}}  # {doc}" if doc else text)
  return "\n".join(out).lstrip("\n")
