"""Lines of grpo_jax/*.py at a commit, optionally leaving out folders and the lines that a range
of later commits wrote (by `git blame -M -C`: a line moved or copied keeps its first author).

    python benchmarks/package_lines.py --rev=bfe5b97
    python benchmarks/package_lines.py --rev=HEAD --not_written_by=7e257c7..a4281f9 \
        --leave_out=grpo_jax/envs/,grpo_jax/train/sources/episodes.py

Issue 54's budget (its lines may not grow by more than 3%) is measured this way in
docs/architecture.md: the redesign's tree against bfe5b97, with what the later issues wrote
counted apart.
"""

import subprocess

from absl import app, flags

_REV = flags.DEFINE_string("rev", "HEAD", "The commit to count.")
_LATER = flags.DEFINE_string("not_written_by", "", "A git range (A..B) whose lines are counted "
                             "apart; empty: count every line.")
_LEAVE_OUT = flags.DEFINE_list("leave_out", [], "Path prefixes counted apart.")


def git(*args) -> str:
  return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def line_authors(rev: str, path: str) -> list:
  """The commit that wrote each line of path at rev (`git blame --porcelain`: one header line
  `sha orig_line final_line [count]` per line of the file)."""
  authors = []
  for line in git("blame", "-M", "-C", "--porcelain", rev, "--", path).splitlines():
    head = line.split()
    if (len(head) >= 3 and len(head[0]) == 40 and head[1].isdigit() and head[2].isdigit()
        and all(c in "0123456789abcdef" for c in head[0])):
      authors.append(head[0])
  return authors


def main(argv):
  del argv
  later = set(git("rev-list", _LATER.value).split()) if _LATER.value else set()
  files = [f for f in git("ls-tree", "-r", "--name-only", _REV.value, "grpo_jax").split()
           if f.endswith(".py")]
  counted = by_later = left_out = 0
  for path in files:
    if any(path.startswith(p) for p in _LEAVE_OUT.value):
      left_out += git("show", f"{_REV.value}:{path}").count("\n")
    elif later:
      authors = line_authors(_REV.value, path)
      by_later += sum(a in later for a in authors)
      counted += sum(a not in later for a in authors)
    else:
      counted += git("show", f"{_REV.value}:{path}").count("\n")
  print(f"{_REV.value}: {counted} lines of grpo_jax/ counted; {by_later} written by "
        f"{_LATER.value or '(no range)'}; {left_out} in {','.join(_LEAVE_OUT.value) or '(none)'}")


if __name__ == "__main__":
  app.run(main)
