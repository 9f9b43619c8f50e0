"""What the test suite catches: deliberate defects ("mutants") put into a scratch copy of the
tree one at a time, and the tests that should fail run on each.

    python benchmarks/mutation_check.py [--only id1,id2] [--full] [--json out.jsonl]
    python benchmarks/mutation_check.py --list        # the defects, their files and tests
    python benchmarks/mutation_check.py --check       # every edit applies, every test exists

For each selected defect (DEFECTS below: an id, one line saying what is wrong, the exact edits
under grpo_jax/ and the candidate tests that should catch it):

  1. the working tree's files (git ls-files: tracked, and untracked ones that git does not
     ignore; never .git or .venv) are copied into a temporary folder;
  2. the edits are applied there; each `old` string must occur exactly once in its file, or
     the run stops with the defect's name (so a refactor that moves the code is noticed);
  3. `import grpo_jax` from the copy, with the environment the tests get, must resolve into the
     copy (PYTHONPATH = the copy, cwd = the copy: they come before the editable install's
     finder), else the run refuses to go on;
  4. `python -m pytest -x -q -rfE -p no:randomly <candidate tests>` runs in the copy with this
     interpreter (--full: the whole suite), under the copy's pyproject.toml addopts (-n 2
     --dist loadfile). A candidate written "tests/x.py -k EXPR" runs on its own, after the
     others.

Outcomes: caught (pytest exit status 1: a test failed or errored), with the first failing
test's node id (the "FAILED" / "ERROR" lines of the short summary) and the seconds pytest ran
(-x stops at the first failure, so that is the time to the first failure); not caught (0: all
passed); error (2: interrupted or a collection error; 3 internal; 4 usage); no tests (5); or
timeout (--timeout seconds per defect; JSON returncode null). A run ends with a Markdown table
| defect | caught by | seconds to first failure | (for a defect not caught, the outcome and, in
parentheses, the seconds its tests ran), and exits 0 only when every selected defect was caught.

Options: --only id1,id2; --full (the whole suite, `pytest -x -q`, for each defect); --timeout
SECONDS per defect (default 900); --json PATH (one line per defect: defect, description,
caught, first_failure, seconds, selection, returncode); --baseline (first run the same tests
on an unchanged copy, which must pass, else a "caught" would mean nothing); --logs DIR (each
run's pytest output, DIR/<id>.log); --keep (leave the scratch copies).

Limits: a test that starts Python in a folder outside the copy with its own PYTHONPATH
(tests/test_table.py's README run) imports the installed package, not the copy, so it cannot
catch a defect. The defects run one after the other; the suite's own budget applies to each
--full run (about 25 minutes on the 2-core CI machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTEST = ("-m", "pytest", "-x", "-q", "-rfE", "-p", "no:randomly")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutation_defects import DEFECTS, Defect  # noqa: E402


class MutationError(Exception):
  """An edit that does not apply (its old string missing or repeated)."""


def by_id(ids: str | None) -> list:
  """The defects named in `ids` (comma-separated; None: all), in the table's order."""
  if not ids:
    return list(DEFECTS)
  wanted = [i.strip() for i in ids.split(",") if i.strip()]
  known = {d.id: d for d in DEFECTS}
  unknown = [i for i in wanted if i not in known]
  if unknown:
    raise SystemExit(f"unknown defect id(s) {', '.join(unknown)}; valid: "
                     f"{', '.join(known)}.")
  return [d for d in DEFECTS if d.id in wanted]


def apply_edits(root: str, edits) -> None:
  """Applies (file, old, new) edits under `root`; each old string must occur exactly once."""
  for file, old, new in edits:
    path = os.path.join(root, file)
    with open(path, encoding="utf-8") as f:
      text = f.read()
    count = text.count(old)
    if count != 1:
      raise MutationError(f"{file}: the string to replace occurs {count} times (exactly 1 "
                          f"needed): {old!r}")
    with open(path, "w", encoding="utf-8") as f:
      f.write(text.replace(old, new))


def working_tree_files() -> list:
  """The repository's files as `git ls-files` lists them: tracked, and untracked ones that
  git does not ignore (so .venv, build outputs and caches stay out)."""
  out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True, check=True).stdout
  return sorted({p for p in out.decode("utf-8", "surrogateescape").split("\0") if p})


def scratch_copy(dest: str) -> None:
  """Copies the working tree's files (working_tree_files) into `dest`."""
  for rel in working_tree_files():
    if rel.split("/", 1)[0] in (".git", ".venv"):
      continue
    src = os.path.join(ROOT, rel)
    if not os.path.lexists(src) or (os.path.isdir(src) and not os.path.islink(src)):
      continue  # deleted in the working tree, or a submodule
    dst = os.path.join(dest, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(src, dst, follow_symlinks=False)


def scratch_env(scratch: str) -> dict:
  """The tests' environment: the copy first on PYTHONPATH; no durations file of a CI run."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (scratch, env.get("PYTHONPATH")) if p)
  env.pop("GRPO_JAX_TEST_DURATIONS", None)  # (tests/conftest.py would overwrite CI's file)
  return env


def check_import(scratch: str, env: dict) -> None:
  """Refuses to go on unless `import grpo_jax`, run as the tests run, resolves into the copy."""
  out = subprocess.run([sys.executable, "-c", "import grpo_jax; print(grpo_jax.__file__)"],
                       cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
  lines = out.stdout.strip().splitlines()
  where = lines[-1] if lines else ""
  inside = os.path.realpath(where).startswith(os.path.realpath(scratch) + os.sep)
  if out.returncode != 0 or not where or not inside:
    raise SystemExit(f"refusing to run: from the scratch copy {scratch}, `import grpo_jax` "
                     f"gives {where or out.stderr.strip()[-500:]!r}, not the copy, so the "
                     f"tests would not see the defect. Run with the project's environment "
                     f"(an editable install's finder comes after PYTHONPATH; a regular "
                     f"install of grpo_jax in site-packages does too, unless something "
                     f"reorders sys.path).")


def runs_of(tests, full: bool) -> list:
  """pytest argument lists: the plain selections together, then each "-k" one alone."""
  if full:
    return [[]]
  plain, alone = [], []
  for entry in tests:
    parts = shlex.split(entry)
    if "-k" in parts:
      alone.append(parts)
    else:
      plain.extend(parts)
  return ([plain] if plain else []) + alone


def _stop(proc) -> None:
  """Ends the pytest run we started (its own process group: xdist workers included)."""
  for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
    try:
      os.killpg(proc.pid, sig)
    except ProcessLookupError:
      return
    try:
      proc.wait(timeout=grace)
      return
    except subprocess.TimeoutExpired:
      continue


def run_pytest(args: list, cwd: str, env: dict, timeout: float):
  """(exit status or None on timeout, output, seconds) of one pytest run in `cwd`."""
  start = time.monotonic()
  proc = subprocess.Popen([sys.executable, *PYTEST, *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", start_new_session=True)
  try:
    out, _ = proc.communicate(timeout=max(timeout, 1.0))
    code = proc.returncode
  except subprocess.TimeoutExpired:
    _stop(proc)
    out, _ = proc.communicate()
    code = None
  except BaseException:
    _stop(proc)
    raise
  return code, out, time.monotonic() - start


_FAILED = re.compile(r"^(?:\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?)?(FAILED|ERROR)\s+(\S.*?)"
                     r"(?:\s+-\s+.*)?$")


def first_failure(output: str) -> str | None:
  """The node id of the first "FAILED <id>" / "ERROR <id>" line (short summary, or xdist's
  "[gwN] [ x%] FAILED <id>" progress lines)."""
  for line in output.splitlines():
    m = _FAILED.match(line.strip())
    if m and ("::" in m.group(2) or m.group(2).startswith("tests")):
      return m.group(2).strip()
  return None


_SOME_FAILED = re.compile(r"^=*\s*\d+ failed\b|\b\d+ failed(?:, [^\n]*)? in [\d.]+s", re.M)

OUTCOMES = {0: "not caught", 1: "caught", 2: "error (interrupted or collection error)",
            3: "error (pytest internal error)", 4: "error (pytest usage error)",
            5: "no tests collected"}


def outcome(code) -> str:
  return "timeout" if code is None else OUTCOMES.get(code, f"error (exit status {code})")


def check_defect(defect: Defect, args, *, mutate: bool = True) -> dict:
  """Copies the tree, applies the defect's edits (unless mutate=False) and runs its tests."""
  scratch = tempfile.mkdtemp(prefix=f"grpo_jax_mutant_{defect.id}_")
  try:
    scratch_copy(scratch)
    if mutate:
      apply_edits(scratch, defect.edits)
    env = scratch_env(scratch)
    check_import(scratch, env)
    deadline = time.monotonic() + args.timeout
    code, seconds, outputs, failed = 0, 0.0, [], None
    for selection in runs_of(defect.tests, args.full):
      left = deadline - time.monotonic()
      if left <= 0:
        code = None
        break
      run_code, out, took = run_pytest(selection, scratch, env, left)
      if run_code == 2 and _SOME_FAILED.search(out):
        run_code = 1  # pytest-xdist ends an -x run that failed as "Interrupted" (status 2)
      seconds += took
      outputs.append(f"$ pytest {' '.join(PYTEST[2:] + tuple(selection))}\n{out}")
      if run_code is None or run_code == 1:
        code = run_code
        failed = first_failure(out) if run_code == 1 else None
        if run_code == 1 and failed is None:
          failed = "(a failure pytest did not name)"
        break
      if run_code != 0:
        code = run_code  # reported, even if a later run passes
    if args.logs:
      os.makedirs(args.logs, exist_ok=True)
      with open(os.path.join(args.logs, f"{defect.id}.log"), "w") as f:
        f.write("\n".join(outputs))
    if code not in (0, 1):
      tail = "\n".join("\n".join(outputs).splitlines()[-40:])
      print(f"  {defect.id}: {outcome(code)}; the end of pytest's output:\n{tail}",
            file=sys.stderr)
    return dict(defect=defect.id, description=defect.description, caught=code == 1,
                first_failure=failed, seconds=round(seconds, 1),
                selection=["tests (full suite)"] if args.full else list(defect.tests),
                returncode=code)
  finally:
    if args.keep:
      print(f"  scratch copy kept: {scratch}", file=sys.stderr)
    else:
      shutil.rmtree(scratch, ignore_errors=True)


def static_check(defects) -> list:
  """Problems found without running anything: edits that do not apply exactly once, files
  outside grpo_jax/, candidate tests whose file or function does not exist."""
  problems = []
  for d in defects:
    for file, old, new in d.edits:
      if not file.startswith("grpo_jax/"):
        problems.append(f"{d.id}: {file} is not under grpo_jax/")
      path = os.path.join(ROOT, file)
      if not os.path.isfile(path):
        problems.append(f"{d.id}: {file} does not exist")
        continue
      with open(path, encoding="utf-8") as f:
        count = f.read().count(old)
      if count != 1:
        problems.append(f"{d.id}: the old string occurs {count} times in {file}: {old!r}")
      if old == new:
        problems.append(f"{d.id}: the edit of {file} changes nothing")
    for entry in d.tests:
      for part in shlex.split(entry):
        if not part.startswith("tests/"):
          continue
        file, _, name = part.partition("::")
        if not os.path.isfile(os.path.join(ROOT, file)):
          problems.append(f"{d.id}: {file} does not exist")
          continue
        name = name.split("[", 1)[0]
        with open(os.path.join(ROOT, file), encoding="utf-8") as f:
          text = f.read()
        if name and not re.search(rf"^\s*def {re.escape(name)}\(", text, re.M):
          problems.append(f"{d.id}: {file} has no test {name}")
  ids = [d.id for d in DEFECTS]
  problems += [f"defect id {i} is used twice" for i in sorted({i for i in ids
                                                                if ids.count(i) > 1})]
  return problems


def markdown_table(results: list) -> str:
  rows = ["| defect | caught by | seconds to first failure |", "|---|---|---|"]
  for r in results:
    if r["caught"]:
      by, seconds = f"`{r['first_failure']}`", f"{r['seconds']:.1f}"
    else:
      by, seconds = f"**{outcome(r['returncode'])}**", f"({r['seconds']:.1f})"
    rows.append(f"| {r['defect']} | {by} | {seconds} |")
  return "\n".join(rows)


def print_list(defects) -> None:
  for d in defects:
    files = sorted({file for file, _, _ in d.edits})
    print(f"{d.id}\n  {d.description}\n  edits: {', '.join(files)}")
    for entry in d.tests:
      print(f"  test:  {entry}")


def baseline(defects, args) -> None:
  """The same tests on an unchanged copy; they must pass."""
  tests = tuple(dict.fromkeys(t for d in defects for t in d.tests))
  clean = Defect("baseline", "no defect", "", "", "", tests)
  print(f"baseline: {'the whole suite' if args.full else f'{len(tests)} selections'} on an "
        f"unchanged copy ...", flush=True)
  result = check_defect(clean, args, mutate=False)
  if result["returncode"] != 0:
    raise SystemExit(f"baseline: {outcome(result['returncode'])}"
                     f"{' at ' + result['first_failure'] if result['first_failure'] else ''} "
                     f"without any defect; fix that first (a defect could not be told apart).")
  print(f"baseline: passed in {result['seconds']:.1f} s", flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", help="comma-separated defect ids (default: all)")
  parser.add_argument("--list", action="store_true", help="print the defects and exit")
  parser.add_argument("--check", action="store_true",
                      help="check that every edit applies and every candidate test exists")
  parser.add_argument("--full", action="store_true",
                      help="run the whole suite (pytest -x -q) for each defect")
  parser.add_argument("--timeout", type=float, default=900.0,
                      help="seconds per defect (default 900)")
  parser.add_argument("--json", help="write one JSON line per defect to this file")
  parser.add_argument("--baseline", action="store_true",
                      help="first run the same tests on an unchanged copy (they must pass)")
  parser.add_argument("--logs", help="write each defect's pytest output to DIR/<id>.log")
  parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
  args = parser.parse_args(argv)
  defects = by_id(args.only)
  if args.list:
    print_list(defects)
    return 0
  problems = static_check(defects)
  if problems or args.check:
    print("\n".join(problems) or f"{len(defects)} defects: every edit applies exactly once "
                                  f"and every candidate test exists.")
    return 1 if problems else 0
  if args.baseline:
    baseline(defects, args)
  out = open(args.json, "w") if args.json else None
  results = []
  try:
    for i, defect in enumerate(defects, 1):
      print(f"[{i}/{len(defects)}] {defect.id}: {defect.description}", flush=True)
      try:
        result = check_defect(defect, args)
      except MutationError as e:
        raise SystemExit(f"{defect.id}: {e}") from None
      results.append(result)
      said = (f"caught by {result['first_failure']}" if result["caught"]
              else outcome(result["returncode"]).upper())
      print(f"  {said} ({result['seconds']:.1f} s)", flush=True)
      if out:
        out.write(json.dumps(result) + "\n")
        out.flush()
  finally:
    if out:
      out.close()
  print()
  print(markdown_table(results))
  caught = sum(r["caught"] for r in results)
  print(f"\n{caught} of {len(results)} defects caught.")
  return 0 if caught == len(results) else 1


if __name__ == "__main__":
  sys.exit(main())
