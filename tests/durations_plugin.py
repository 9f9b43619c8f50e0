"""Every test's setup / call / teardown seconds, written where $GRPO_JAX_TEST_DURATIONS says
(.ci/run sets it; benchmarks/suite_time.py reads the file and prints what is over budget).
Recorded by the controller only: pytest-xdist hands it every worker's reports. Loaded by
tests/conftest.py, which imports its hooks."""

import json
import os
import platform
import time

_durations = {"tests": {}, "start": None}


def pytest_sessionstart(session):
  _durations["start"] = time.time()


def pytest_runtest_logreport(report):
  if not os.environ.get("GRPO_JAX_TEST_DURATIONS"):
    return
  entry = _durations["tests"].setdefault(report.nodeid, {"outcome": "passed"})
  entry[report.when] = round(report.duration, 3)
  if report.failed or (report.skipped and report.when != "teardown"):
    entry["outcome"] = "failed" if report.failed else "skipped"
  worker = getattr(report, "node", None)
  if worker is not None:
    entry["worker"] = worker.gateway.id


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    return platform.machine()


def pytest_sessionfinish(session, exitstatus):
  path = os.environ.get("GRPO_JAX_TEST_DURATIONS")
  if not path or hasattr(session.config, "workerinput"):
    return
  with open(path, "w") as f:
    json.dump({"wall_s": round(time.time() - _durations["start"], 1), "exitstatus": int(exitstatus),
               "cpu": _cpu_name(), "cores": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "tests": _durations["tests"]}, f, indent=0)
