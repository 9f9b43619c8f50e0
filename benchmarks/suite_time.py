"""The test suite's time against its budget: reads the durations of one pytest run and prints the
slowest tests and files and everything over budget. It never fails a run because a machine is
slow (exit status 0 whatever it finds); `.ci/run` prints it after pytest.

    python benchmarks/suite_time.py .ci/last/durations.json [--top 30] [--files 15] [--markdown]

Inputs it reads:
- the JSON that tests/conftest.py writes where $GRPO_JAX_TEST_DURATIONS says (every test's
  setup / call / teardown seconds, the session's wall time);
- or a pytest log run with `--durations=0` (the "12.34s call tests/x.py::test" lines and the
  final "N passed in S s" line), for a run made before that file existed.

The budget (tests/README.md): pytest <= 25 minutes on the 2-core CI machine; each test <= 20 s,
setup and call (a module fixture's cost lands in its file's first test); at most 10 named
end-to-end tests, listed with their reasons in tests/README.md's table, <= 90 s each.
"""

import argparse
import collections
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE_S, TEST_S, LONG_S, LONG_MAX = 25 * 60, 20.0, 90.0, 10
_LOG_LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(tests/\S.*?)\s*$")
_LOG_END = re.compile(r"^=*\s*(\d+ (?:passed|failed).*) in ([\d.]+)s")


def read_json(path):
  with open(path) as f:
    data = json.load(f)
  return data["tests"], data.get("wall_s"), data


def read_log(path):
  """A pytest log's --durations=0 section: {nodeid: {phase: seconds}}, its wall time."""
  tests, wall = collections.defaultdict(dict), None
  with open(path, errors="replace") as f:
    for line in f:
      m = _LOG_LINE.match(line)
      if m:
        tests[m.group(3)][m.group(2)] = float(m.group(1))
      m = _LOG_END.search(line)
      if m and ("passed" in m.group(1) or "failed" in m.group(1)):
        wall = float(m.group(2))
  return dict(tests), wall, {}


def long_tests(readme=os.path.join(ROOT, "tests", "README.md")):
  """The named end-to-end tests allowed up to 90 s: the node ids in the table of tests/README.md's
  "Named end-to-end tests" section (a row starting with a backticked `tests/...` id; an id
  without [params] names them all)."""
  if not os.path.exists(readme):
    return []
  with open(readme) as f:
    text = f.read()
  section = text.split("## Named end-to-end tests", 1)[-1].split("\n## ", 1)[0]
  return re.findall(r"^\|\s*`(tests/[^`]+)`", section, re.M)


def is_named(nodeid, names):
  return any(nodeid == n or nodeid.startswith(n + "[") for n in names)


def seconds(phases):
  return sum(phases.get(p, 0.0) for p in ("setup", "call", "teardown"))


def report(tests, wall, meta, top, files, markdown):
  out = []
  say = out.append
  outcomes = collections.Counter(t.get("outcome", "?") for t in tests.values())
  total = sum(seconds(t) for t in tests.values())
  head = f"{len(tests)} tests"
  if meta:
    head += " (" + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) + ")"
  say(f"{head}; pytest wall {_clock(wall)}; test time summed over workers {_clock(total)}"
      + (f"; {meta.get('cpu')}, {meta.get('cores')} cores, {meta.get('date')}" if meta else ""))
  ranked = sorted(tests.items(), key=lambda kv: -seconds(kv[1]))
  say("")
  say(f"Slowest {top} tests (seconds: total = setup + call + teardown):")
  rows = [(n, seconds(t), t.get("setup", 0.0), t.get("call", 0.0)) for n, t in ranked[:top]]
  say(_table(["test", "total", "setup", "call"], rows, markdown))
  by_file = collections.defaultdict(lambda: [0.0, 0.0, 0])
  for n, t in tests.items():
    f = by_file[n.split("::")[0]]
    f[0] += seconds(t)
    f[1] += t.get("setup", 0.0)
    f[2] += 1
  say("")
  say(f"Slowest {files} files (seconds; setup = its tests' setups, module fixtures included):")
  rows = [(name, s, setup, n) for name, (s, setup, n) in
          sorted(by_file.items(), key=lambda kv: -kv[1][0])[:files]]
  say(_table(["file", "total", "setup", "tests"], rows, markdown))
  say("")
  say(_over_budget(tests, wall, long_tests()))
  return "\n".join(out)


def _over_budget(tests, wall, names):
  lines = []
  if wall is not None and wall > SUITE_S:
    lines.append(f"- pytest took {_clock(wall)}, over its {SUITE_S // 60}-minute budget")
  named = [n for n in tests if is_named(n, names)]
  if len(names) > LONG_MAX:
    lines.append(f"- {len(names)} tests are named end-to-end (tests/README.md); at most {LONG_MAX}")
  for n, t in sorted(tests.items(), key=lambda kv: -seconds(kv[1])):
    s = t.get("setup", 0.0) + t.get("call", 0.0)
    limit = LONG_S if n in named else TEST_S
    if s > limit:
      kind = "named end-to-end test" if n in named else "test"
      lines.append(f"- {n}: {s:.1f} s (setup {t.get('setup', 0.0):.1f} + call "
                   f"{t.get('call', 0.0):.1f}), over the {limit:.0f} s of a {kind}")
  if not lines:
    return (f"Within budget: pytest <= {SUITE_S // 60} min, every test <= {TEST_S:.0f} s "
            f"but the {len(names)} named end-to-end tests <= {LONG_S:.0f} s.")
  return "Over budget:\n" + "\n".join(lines)


def _clock(s):
  return "?" if s is None else f"{int(s // 60)}:{int(s % 60):02d} ({s:.0f} s)"


def _table(header, rows, markdown):
  cells = [[str(c) if not isinstance(c, float) else f"{c:.1f}" for c in r] for r in rows]
  if markdown:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])
  width = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
           for i, h in enumerate(header)]
  fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                            for i, (c, w) in enumerate(zip(r, width)))
  return "\n".join([fmt(header)] + [fmt(c) for c in cells])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("path", help="durations JSON (tests/conftest.py) or a pytest --durations=0 log")
  p.add_argument("--top", type=int, default=30)
  p.add_argument("--files", type=int, default=15)
  p.add_argument("--markdown", action="store_true", help="Markdown tables (for RESULTS.md)")
  args = p.parse_args(argv)
  if not os.path.exists(args.path):
    print(f"suite_time: no durations at {args.path} (pytest did not write them)")
    return 0
  tests, wall, meta = (read_json if args.path.endswith(".json") else read_log)(args.path)
  print(report(tests, wall, meta, args.top, args.files, args.markdown))
  return 0


if __name__ == "__main__":
  sys.exit(main())
