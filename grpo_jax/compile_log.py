"""Every XLA program a run compiles, counted and timed from JAX's own compile events
(jax.monitoring: the trace, the lowering to MLIR and the backend compile of each jitted
function), and said once on the console when it took long enough to notice.

On a GPU a cold compile can take minutes (XLA autotunes every matrix product): a researcher
should see which program is compiling and for how long, not a silent first step. A program
compiled again (new shapes or settings) is counted and said again, so a recompile shows.
"""

from __future__ import annotations

import collections
import threading

from jax import monitoring

_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
           "/jax/core/compile/backend_compile_duration": "compile_s"}
_LOCK = threading.Lock()
_STATE = {"installed": False, "say": None, "min_s": 1.0}
# fun_name -> {"trace_s", "lower_s", "compile_s", "programs"}, since the last reset()
_TABLE: dict = collections.defaultdict(lambda: dict(trace_s=0.0, lower_s=0.0, compile_s=0.0,
                                                    programs=0))
_PENDING: dict = collections.defaultdict(float)  # fun_name -> trace + lower not yet said


def _listener(event: str, duration: float, **kwargs) -> None:
  phase = _EVENTS.get(event)
  shown = kwargs.get("fun_name")
  if phase is None or shown is None:
    return
  # jax (0.10) names the trace after the function, its lowering and compile "jit(<name>)": one
  # row for the three, said as the compile names it
  name = shown[4:-1] if shown.startswith("jit(") and shown.endswith(")") else shown
  with _LOCK:
    row = _TABLE[name]
    row[phase] += duration
    if phase != "compile_s":
      _PENDING[name] += duration
      return
    row["programs"] += 1
    before = _PENDING.pop(name, 0.0)
    say, count = _STATE["say"], sum(r["programs"] for r in _TABLE.values())
  if say is not None and duration >= _STATE["min_s"]:
    say(f"compiled {shown} in {duration:.1f} s (+{before:.1f} s tracing and lowering; "
        f"{count} programs compiled so far)")


def install(say=None, min_s: float = 1.0) -> None:
  """Starts counting (once per process) and says each compile of >= min_s seconds through
  `say` (None: count silently)."""
  with _LOCK:
    _STATE.update(say=say, min_s=min_s)
    if not _STATE["installed"]:
      monitoring.register_event_duration_secs_listener(_listener)
      _STATE["installed"] = True


def table() -> dict:
  """{function name: {"trace_s", "lower_s", "compile_s", "programs"}} since the last reset()
  (a copy); a persistent-cache hit is a program with a short compile_s."""
  with _LOCK:
    return {name: dict(row) for name, row in _TABLE.items()}


def reset() -> None:
  with _LOCK:
    _TABLE.clear()
    _PENDING.clear()
