"""Text that JSON can carry but Unicode cannot: a lone surrogate (JSON's "\\udc80" escape, or a
string cut inside a surrogate pair) decodes into a Python str that no tokenizer can encode. Rows
are checked when read, so that the fault is named with its file and line before any compute."""

from __future__ import annotations


def lone_surrogate(value, field: str = ""):
  """(the field's path, e.g. "messages[0].content", and the offending character) of the first
  string inside `value` (a str, or dicts and lists of them) that is not valid Unicode; None when
  every string is."""
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError as e:
      return field or "the value", value[e.start]
    return None
  if isinstance(value, dict):
    for k in value:  # a key is text too
      found = lone_surrogate(k, f"{field}.{k!a}" if field else f"{k!a}") \
          if isinstance(k, str) else None
      if found is not None:
        return found
    items = ((f"{field}.{k}" if field else str(k), v) for k, v in value.items())
  elif isinstance(value, (list, tuple)):
    items = (((f"{field}[{i}]" if field else f"[{i}]"), v) for i, v in enumerate(value))
  else:
    return None
  for name, item in items:
    found = lone_surrogate(item, name)
    if found is not None:
      return found
  return None


def surrogate_sentence(found) -> str:
  """The middle of the error sentence for `lone_surrogate`'s answer."""
  name, char = found
  return (f"has text that is not valid Unicode in {name} (a lone surrogate "
          f"\\u{ord(char):04x}, which a JSON escape such as \"\\udc80\" can write)")


def clean_text(text: str) -> str:
  """`text` with every lone surrogate replaced by U+FFFD: for text from a running program (a
  tool's output), which is shown to the policy rather than refused."""
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
