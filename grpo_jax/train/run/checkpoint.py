"""Checkpoints of the whole TrainState (policy, optimizer, reference, critic, step, key, data
position, KL coefficient, skip counters) with orbax, and restoring the newest readable one.

A checkpoint is written to a temporary folder and renamed when complete (orbax's atomic save),
so a run killed mid-save leaves no half-written step behind. Each step folder is restored on its
own (not through the manager, which stops reading every step once one of them lacks its item
folder), after checking the CRC-32 of each of its files against `<step>/crc32.json`, written at
save: a damaged step (missing or empty folder, a truncated file, flipped bytes, a non-finite
value) is moved aside and the one before it is used.

Checkpoints written before the stacked layer layout became the only one hold each layer's
params (and optimizer moments, reference, critic, adapters) as ``layers_0`` ... ``layers_{L-1}``;
they are read in that layout and stacked on restore (`_per_layer_template`, `_stack_layers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import sys
import tempfile
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from grpo_jax.errors import first_line, silence_stderr_for_good
from grpo_jax.models.layout import stack_layers, unstack_layers
from grpo_jax.train.run import files
from grpo_jax.train.run.faults import RunStopped
from grpo_jax.train.learner.state import RunState, SourceState, TrainState


class _WithSource(TrainState):
  """What an RL checkpoint holds: the learner's fields and, beside them, the source's."""
  source: SourceState | None = None


class _WithDataPosition(TrainState):
  """The older layout, still restored: the learner's fields with data_position among them (no
  source beside them)."""
  data_position: jax.Array | None = None


def _fields(state: TrainState) -> dict:
  return {f: getattr(state, f) for f in TrainState.__dataclass_fields__}


def to_saveable(state: TrainState | RunState) -> TrainState:
  """The state with its typed PRNG keys replaced by their raw uint32 data, and without
  LoRA's frozen base (rebuilt from model.path on resume: a checkpoint holds the adapters); a
  RunState as the learner's fields with the source's beside them."""
  if isinstance(state, RunState):
    source = state.source.replace(key=jax.random.key_data(state.source.key))
    return _WithSource(**_fields(to_saveable(state.train)), source=source)
  return state.replace(key=jax.random.key_data(state.key), base_params=None)


def from_saveable(tree: TrainState) -> TrainState | RunState:
  """Inverse of to_saveable (the keys get jax's default implementation, as at the start;
  base_params stays None until the caller puts the base back)."""
  if isinstance(tree, _WithSource):
    return RunState(from_saveable(TrainState(**_fields(tree))),
                    tree.source.replace(key=jax.random.wrap_key_data(tree.source.key)))
  return tree.replace(key=jax.random.wrap_key_data(tree.key))


def _from_data_position(tree: _WithDataPosition, template) -> TrainState | RunState:
  """A checkpoint of the older layout in the new one: its data_position and step become the
  source's position and rollout counter (one rollout per step, the key the learner's)."""
  train = from_saveable(TrainState(**_fields(tree)))
  if not isinstance(template, RunState):
    return train
  return RunState(train, SourceState(key=jax.random.clone(train.key),  # (not shared: the
                                     data_position=tree.data_position,  # train state is donated)
                                     rollouts=jnp.copy(tree.step)))


def step_of(state: TrainState) -> int:
  """The state's step (one number also for seeds stacked on a leading axis, which move in
  lockstep)."""
  steps = np.unique(np.asarray(state.step))
  if len(steps) != 1:
    raise ValueError(f"the stacked states are at different steps {steps.tolist()}")
  return int(steps[0])


def check_restored(state: TrainState, step: int) -> None:
  """Raises ValueError if a restored state does not belong to `step` or holds a non-finite
  value anywhere (params, optimizer moments, reference, critic: a checkpoint that reads without
  error but is damaged)."""
  if step_of(state) != step:
    raise ValueError(f"the state inside says step {np.asarray(state.step).tolist()}")
  floats = [x for x in jax.tree.leaves(to_saveable(state))
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  if not all(bool(jnp.all(jnp.isfinite(x))) for x in floats):
    raise ValueError("it holds non-finite values")


CRC_FILE = "crc32.json"  # in each step folder: {relative path: CRC-32} of its item's files


def file_checksums(item_dir: str) -> dict:
  """{path relative to the step folder: CRC-32 (hex)} of every file under `item_dir`."""
  base = files.path(item_dir).parent
  sums = {}
  for root, _, names in files.path(item_dir).walk():
    for name in sorted(names):
      path = root / name
      crc = 0
      with path.open("rb") as f:
        while chunk := f.read(1 << 24):
          crc = zlib.crc32(chunk, crc)
      sums[str(path.relative_to(base))] = f"{crc:08x}"
  return sums


def verify_checksums(step_dir: str) -> None:
  """Raises ValueError naming the first file whose CRC-32 differs from the one recorded at save
  (or that is missing); a step saved without a record is not checked."""
  text = files.read_text(files.path(step_dir, CRC_FILE))
  if text is None:
    return
  want = json.loads(text)
  got = file_checksums(os.path.join(step_dir, "default"))
  for path, crc in sorted(want.items()):
    if got.get(path) != crc:
      raise ValueError(f"{path} is {'missing' if path not in got else 'changed'} since the save "
                       f"(CRC-32 {got.get(path)} != {crc})")


@contextlib.contextmanager
def _stderr_held(keep=lambda: True):
  """Holds what is written to file descriptor 2 in memory while orbax saves or restores, and
  writes it out afterwards only if that succeeded (and `keep()` says so). A failed save (a full
  disk above all) or restore makes orbax's threads print hundreds of tracebacks; the run's own
  one-sentence error replaces them (and on the command line, whatever they print later:
  grpo_jax.errors.silence_stderr_for_good)."""
  sys.stderr.flush()
  saved = os.dup(2)
  held = (os.memfd_create("grpo_jax_save_stderr") if hasattr(os, "memfd_create") else
          tempfile.TemporaryFile().detach().fileno())  # not on the (full) disk where possible
  os.dup2(held, 2)
  failed = False
  try:
    yield
  except BaseException:
    failed = True
    raise
  finally:
    sys.stderr.flush()
    if not (failed and silence_stderr_for_good(saved)):  # else fd 2 stays silent, saved kept
      os.dup2(saved, 2)
      os.close(saved)
      if not failed and keep():
        os.lseek(held, 0, os.SEEK_SET)
        while chunk := os.read(held, 1 << 16):
          try:
            os.write(2, chunk)
          except OSError:  # stderr gone (a hung-up terminal): the save itself succeeded
            break
    os.close(held)


def _has_per_layer_params(saved_tree) -> bool:
  """Whether a checkpoint's tree (its metadata) holds layers as layers_0, layers_1, ..."""
  return any(getattr(k, "key", None) == "layers_0"
             for path, _ in jax.tree_util.tree_flatten_with_path(saved_tree)[0] for k in path)


def _holds_stacked_layers(x) -> bool:
  return isinstance(x, dict) and isinstance(x.get("layers"), dict)


def _restore_item(checkpointer, item: str, template, saved: dict):
  """checkpointer.restore(item, template); a checkpoint `saved` (its metadata tree) before the
  learner counted the steps without signal is read as a dict without that count,
  which then starts at 0."""
  if saved.get("no_signal_updates") is not None:
    return checkpointer.restore(item, template)
  target = {f.name: getattr(template, f.name) for f in dataclasses.fields(template)
            if f.name != "no_signal_updates" or f.name in saved}
  if "no_signal_updates" in target:  # saved as None
    target["no_signal_updates"] = None
  tree = checkpointer.restore(item, target)
  return template.replace(**{**tree, "no_signal_updates":
                             np.zeros(np.shape(tree["step"]), np.int32)})


def _per_layer_template(abstract):
  """`abstract` (stacked layers) in the per-layer layout of older checkpoints: every dict's
  "layers" entry replaced by layers_0 ... layers_{L-1}, each one layer's slice."""
  def one_layer(s):
    sharding = s.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
      sharding = jax.sharding.NamedSharding(sharding.mesh,
                                            jax.sharding.PartitionSpec(*sharding.spec[1:]))
    return jax.ShapeDtypeStruct(s.shape[1:], s.dtype, sharding=sharding)

  def unstack(x):
    if not _holds_stacked_layers(x):
      return x
    return unstack_layers(x, jax.tree.leaves(x["layers"])[0].shape[0], lambda s, i: one_layer(s))
  return jax.tree.map(unstack, abstract, is_leaf=_holds_stacked_layers)


def _stack_layers(tree, abstract):
  """Inverse of _per_layer_template on restored arrays, placed as `abstract` says."""
  def stack(like, x):
    if not _holds_stacked_layers(like):
      return x
    return stack_layers(x, jax.tree.leaves(like["layers"])[0].shape[0])
  stacked = jax.tree.map(stack, abstract, tree, is_leaf=_holds_stacked_layers)
  return jax.tree.map(lambda x, s: jax.device_put(x, s.sharding) if s.sharding else x,
                      stacked, abstract)


def _permission_denied(error: BaseException) -> bool:
  """Whether `error`, or one it was raised from, is a permission error (orbax and tensorstore
  wrap the OSError in their own types, keeping its text)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, PermissionError) or any(
        s in str(error) for s in ("Permission denied", "PERMISSION_DENIED")):
      return True
    error = error.__cause__ or error.__context__
  return False


class Checkpoints:
  """Saves every state handed to `save` under `directory/<step>`, keeping the newest `keep`."""

  def __init__(self, directory: str, keep: int, log=print):
    # (a URI stays one: orbax writes gs:// itself; abspath made it a local "gs:" folder)
    self.directory = directory if files.is_uri(directory) else os.path.abspath(directory)
    self.log = log
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=False,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def steps(self) -> list[int]:
    """Steps with a complete checkpoint, oldest first."""
    self.manager.reload()
    return sorted(self.manager.all_steps())

  def save(self, state: TrainState) -> bool:
    """Writes the state as checkpoint `state.step` (synchronously); False if it exists."""
    step = step_of(state)
    before = self.steps()
    if step in before:
      return False
    try:
      with _stderr_held():
        self.manager.save(step, args=ocp.args.StandardSave(to_saveable(state)), force=True)
        self.manager.wait_until_finished()
      if jax.process_index() == 0:  # the files are complete: record their checksums
        step_dir = os.path.join(self.directory, str(step))
        sums = file_checksums(os.path.join(step_dir, "default"))
        files.write_atomic(files.path(step_dir, CRC_FILE),
                           json.dumps(sums, indent=0, sort_keys=True))
    except Exception as e:  # noqa: BLE001  orbax / tensorstore wrap OSErrors in several types
      raise self._save_failed(step, before, e) from e
    return True

  def _save_failed(self, step: int, before: list, error: Exception) -> RunStopped:
    """The one-sentence stop for a save that failed (a full disk above all): what is left of
    it is removed, so the newest complete checkpoint stays the one a resume reads."""
    # orbax's failed write tasks are collected later, each logging "Task exception was never
    # retrieved" with its traceback: the run is ending with its own sentence, so silence them.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    self._remove_partial(step)
    full = "No space left on device" in str(error) or getattr(error, "errno", None) == 28
    reason = "the disk is full" if full else first_line(error, 200)
    previous = (f"the previous checkpoint {self.directory}/{before[-1]} is intact" if before
                else "no earlier checkpoint exists")
    return RunStopped(f"the checkpoint of step {step} could not be saved ({reason}); {previous}, "
                      f"so {'free some space' if full else 'fix the cause'} and run the same "
                      f"command again to resume from it.")

  def _remove_partial(self, step: int, settle_s: float = 1.0, limit_s: float = 60.0) -> None:
    """Removes what the failed save of `step` left (`<step>` and `<step>.*tmp*`) until none of
    it has reappeared for `settle_s`: the save's other write tasks may still be running when
    the first one fails, and a write can recreate the folder after a removal (seen on a loaded
    machine). Gives up after `limit_s`."""
    folder = files.path(self.directory)
    deadline = time.monotonic() + limit_s
    clean_since = None
    while time.monotonic() < deadline:
      left = [c for c in (folder.iterdir() if folder.is_dir() else ())
              if c.name == str(step) or (c.name.startswith(f"{step}.") and "tmp" in c.name)]
      for child in left:
        with contextlib.suppress(OSError):
          child.rmtree()
      now = time.monotonic()
      if left:
        clean_since = None
      elif clean_since is None:
        clean_since = now
      elif now - clean_since >= settle_s:
        return
      time.sleep(0.1)

  def restore(self, step: int, template: TrainState) -> TrainState:
    """Checkpoint `step` in the structure of `template` (a state or its jax.eval_shape), read
    from its own folder after its checksums are verified, then checked (`check_restored`)."""
    step_dir = os.path.join(self.directory, str(step))
    verify_checksums(step_dir)
    abstract = jax.eval_shape(to_saveable, template)
    item = os.path.join(step_dir, "default")
    with ocp.StandardCheckpointer() as checkpointer:
      saved = checkpointer.metadata(item).item_metadata.tree
      before_source = "data_position" in saved  # the older layout (_WithDataPosition)
      if before_source:
        abstract = _WithDataPosition(**_fields(abstract), data_position=abstract.step)
      # Saved before runs without KL stopped holding a reference copy: read it, then drop it.
      drop_reference = abstract.ref_params is None and bool(jax.tree.leaves(
          saved.get("ref_params")))
      if drop_reference:
        abstract = abstract.replace(ref_params=abstract.params)
      if _has_per_layer_params(saved):
        tree = _stack_layers(_restore_item(checkpointer, item, _per_layer_template(abstract),
                                           saved), abstract)
      else:
        tree = _restore_item(checkpointer, item, abstract, saved)
    if drop_reference:
      tree = tree.replace(ref_params=None)
    state = _from_data_position(tree, template) if before_source else from_saveable(tree)
    check_restored(state, step)
    return state

  def restore_latest(self, template: TrainState) -> TrainState | None:
    """The newest checkpoint that restores; a damaged one is reported in one line and the one
    before it tried. Damaged ones newer than the one restored are moved aside to
    `<step>.unreadable` (the resumed run saves those steps again). None if there is no
    checkpoint; RunStopped if none restores (nothing is moved then). What orbax's failed reads
    print is dropped, as for a failed save (`_stderr_held`)."""
    steps = self.steps()
    damaged = []
    with _stderr_held(keep=lambda: not damaged):
      return self._restore_newest(steps, template, damaged)

  def _restore_newest(self, steps: list, template: TrainState, damaged: list):
    """restore_latest's work, each step that does not restore appended to `damaged`."""
    error = None
    for step in reversed(steps):
      try:
        state = self.restore(step, template)
      except Exception as e:  # noqa: BLE001  orbax / tensorstore raise many types
        gc.collect()  # its abandoned read tasks, which warn when deleted
        if _permission_denied(e):  # intact but not readable by this user: move nothing
          raise RunStopped(f"checkpoint {self.directory}/{step} cannot be read by this user "
                           f"({first_line(e, 200)}); fix its permissions (e.g. chmod -R u+rwX "
                           f"{self.directory}) and run again; nothing was moved.") from None
        error = e
        damaged.append(step)
        self.log(f"warning: checkpoint {self.directory}/{step} cannot be restored "
                 f"({first_line(e, 200)}); trying the one before it.")
        continue
      for bad in damaged:
        files.path(self.directory, str(bad)).rename(self._aside(bad))
      if damaged:
        self.manager.reload()
      return state
    if steps:
      # orbax's failed read tasks, collected later, log "Task exception was never retrieved"
      logging.getLogger("asyncio").setLevel(logging.CRITICAL)
      raise RunStopped(
          f"no checkpoint in {self.directory} (steps {steps}) can be restored, the last error "
          f"being {first_line(error, 200)}; if the model changed since they were written run "
          f"with its recorded config or use a new --workdir (nothing was moved or deleted)."
      ) from error
    return None

  def _aside(self, step: int):
    path, n = files.path(self.directory, f"{step}.unreadable"), 1
    while path.exists():
      path, n = files.path(self.directory, f"{step}.unreadable{n}"), n + 1
    return path

  def close(self) -> None:
    self.manager.close()
