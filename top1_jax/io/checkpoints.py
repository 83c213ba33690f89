"""Checkpoints of a ``train.TrainState`` (one network or a stacked ensemble), by orbax, with
the architecture, parameter shapes and array CRC-32s: restoring into another architecture is
refused, saying what differs, and a damaged checkpoint is found."""

import contextlib
import logging
import os
import pathlib
import re
import shutil
import zlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from etils import epath

from top1_jax.engine import models
from top1_jax.engine.train import TrainState
from top1_jax.io import files

# A fixed name, not TrainState's module path: changing it would make checkpoints unreadable.
_FORMAT = "top1_jax.engine.train.TrainState/1"
_LEGACY_PREFIX = "epoch_"  # an older layout of one ``save_checkpoint`` folder per epoch
_TMP_SUFFIX = ".orbax-checkpoint-tmp"
DAMAGED_SUFFIX = ".damaged"
"""A damaged checkpoint ``<epoch>`` is set aside as ``<epoch>.damaged`` (orbax ignores it)."""


class DamagedCheckpointError(ValueError):
  """A checkpoint that cannot be read back as it was saved; ``why`` says what is wrong."""

  def __init__(self, path, why: str):
    super().__init__(f"directory: the checkpoint at {path} is damaged ({why})")
    self.path, self.why = path, why


def _save_error(path, error: Exception) -> Exception:
  """An ``OSError`` naming ``path`` when the system said why (tensorstore reports a full
  disk as ``ValueError: ... [os_error_code='28']``), else a one-line ValueError."""
  text = " ".join(str(error).split())
  if isinstance(error, OSError) and error.errno is not None:
    return OSError(error.errno, error.strerror, os.fspath(error.filename or path))
  if code := re.search(r"os_error_code='(\d+)'", text):
    return OSError(int(code.group(1)), os.strerror(int(code.group(1))), os.fspath(path))
  return ValueError(
    f"directory: the checkpoint {path} could not be saved ({type(error).__name__}: {text[:200]})"
  )


def _shapes(state: TrainState) -> dict[str, list[int]]:
  tree = {"params": state.params, "model_state": state.model_state}
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in flat}


def _arrays(state: TrainState) -> dict[str, Any]:
  return {key: getattr(state, key) for key in ("step", "params", "model_state", "opt_state")}


def _save_args(state: TrainState) -> ocp.args.Composite:
  # Host copies: orbax writes NumPy arrays from process 0 only, so every process
  # may pass its own copy of a state (local, or replicated over all devices).
  arrays = jax.tree_util.tree_map(np.asarray, _arrays(state))
  flat, _ = jax.tree_util.tree_flatten_with_path(arrays)
  metadata = {
    "format": _FORMAT,
    "architecture": models.architecture(state.model),
    "dropout_rate": state.dropout_rate,
    "shapes": _shapes(state),
    # [CRC-32, dtype] of each array, by its path: a flipped byte is found on restore
    "crc32": {
      jax.tree_util.keystr(path): [zlib.crc32(np.ascontiguousarray(leaf).data), leaf.dtype.str]
      for path, leaf in flat
    },
  }
  return ocp.args.Composite(
    state=ocp.args.StandardSave(arrays), metadata=ocp.args.JsonSave(metadata)
  )


def _local_path(directory: epath.PathLike) -> pathlib.Path | epath.Path:
  """An absolute path for a local folder; a URL as an ``epath.Path``, unchanged."""
  path = files.as_path(directory)
  return path.expanduser().resolve() if isinstance(path, pathlib.Path) else path


def save_checkpoint(
  directory: epath.PathLike, state: TrainState, *, overwrite: bool = False
) -> pathlib.Path | epath.Path:
  """Saves a ``TrainState`` into ``directory``, which must not exist unless ``overwrite``;
  returns its absolute path (an ``epath.Path`` for a URL)."""
  path = _local_path(directory)
  if path.exists() and not overwrite:
    raise ValueError(f"directory: {path} exists; pass overwrite=True to replace it")
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
    checkpointer.save(path, args=_save_args(state), force=overwrite)
  return path


def _shape_mismatch(path, saved: dict, wanted: dict) -> str:
  """The message for parameter shapes that differ, naming the likely cause."""
  names = sorted(n for n in saved.keys() | wanted.keys() if saved.get(n) != wanted.get(n))
  detail = "; ".join(f"{n}: saved {saved.get(n)}, template {wanted.get(n)}" for n in names[:5])
  if saved.keys() == wanted.keys():
    leading = {tuple(saved[n][:1]) for n in names}
    if len(leading) == 1 and all(saved[n][1:] == wanted[n] for n in names):
      detail = f"the checkpoint holds {leading.pop()[0]} stacked members; {detail}"
    elif all(wanted[n][1:] == saved[n] for n in names):
      detail = f"the template is an ensemble, the checkpoint is not; {detail}"
  return (
    f"template: parameter shapes differ from the checkpoint at {path}"
    f" ({len(names)} differ; {detail})"
  )


def _check_metadata(path, metadata: Any, template: TrainState) -> None:
  """Not a checkpoint's metadata: damage; another format, architecture or shapes: a mismatch."""
  fields = {"format": str, "architecture": dict, "shapes": dict, "crc32": (dict, type(None))}
  if not isinstance(metadata, dict) or any(
    not isinstance(metadata.get(k), kinds) for k, kinds in fields.items()
  ):
    raise DamagedCheckpointError(path, "its metadata is not a top1_jax checkpoint's")
  if metadata["format"] != _FORMAT:
    raise ValueError(f"directory: {path} has format {metadata['format']!r}, expected {_FORMAT!r}")
  saved, wanted = metadata["architecture"], models.architecture(template.model)
  if saved != wanted:
    fields = sorted(k for k in saved.keys() | wanted.keys() if saved.get(k) != wanted.get(k))
    detail = ", ".join(f"{k}: saved {saved.get(k)!r}, template {wanted.get(k)!r}" for k in fields)
    raise ValueError(f"template: architecture mismatch with the checkpoint at {path} ({detail})")
  if metadata["shapes"] != _shapes(template):
    raise ValueError(_shape_mismatch(path, metadata["shapes"], _shapes(template)))


def _check_files(path) -> None:
  """Refuses a folder that lacks its parts before orbax opens it: with an OCDBT manifest
  missing, orbax's reader prints a traceback per array from worker threads."""
  if not (path / "metadata").is_dir() or not (path / "state").is_dir():
    raise DamagedCheckpointError(path, "no metadata/ and state/ folders")
  if isinstance(path, pathlib.Path):  # a FIFO would hang orbax's reader, a device fill memory
    for part in path.rglob("*"):
      if not (part.is_file() or part.is_dir()):
        raise DamagedCheckpointError(path, f"{part.relative_to(path)} is not a regular file")
  for shard in (path / "state").glob("ocdbt.process_*"):
    for manifest in (path / "state" / "manifest.ocdbt", shard / "manifest.ocdbt"):
      if not manifest.is_file():
        raise DamagedCheckpointError(path, f"{manifest.name} is missing")


def _check_arrays(path, arrays, crc32s: dict | None) -> None:
  """Each array's CRC-32 (``crc32s`` None: an old checkpoint without them) and, for floats,
  no NaN or infinity (training stops before saving a diverged state)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(arrays)
  names = [jax.tree_util.keystr(key_path) for key_path, _ in flat]
  if crc32s is not None and (differ := set(crc32s) ^ set(names)):  # else one goes unchecked
    raise DamagedCheckpointError(path, f"its CRC-32 table and its arrays differ at {min(differ)}")
  for name, (_, leaf) in zip(names, flat, strict=True):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      if not leaf.sharding.is_fully_replicated:
        continue  # this process holds only a part of it
      leaf = leaf.addressable_data(0)
    host = np.asarray(leaf)
    saved = (crc32s or {}).get(name)
    if saved is not None and saved[1] == host.dtype.str:
      if zlib.crc32(np.ascontiguousarray(host).data) != saved[0]:
        raise DamagedCheckpointError(path, f"{name} does not match its CRC-32")
    if host.dtype.kind == "f" and not np.all(np.isfinite(host)):
      raise DamagedCheckpointError(path, f"{name} holds NaN or infinite values")


def _read(path, restore, template: TrainState) -> TrainState:
  """Checks the files and the metadata, then reads the arrays in the structure of ``template``
  by ``restore(args)`` (orbax's); what orbax cannot parse is a ``DamagedCheckpointError``."""
  _check_files(path)

  def read(**args):
    try:
      return restore(ocp.args.Composite(**args))
    except Exception as e:  # noqa: BLE001 -- orbax raises plain Exception for corrupt files
      first = " ".join(str(e).split()).split(" See full TensorStore details")[0][:200]
      raise DamagedCheckpointError(path, f"{type(e).__name__}: {first}") from None

  metadata = read(metadata=ocp.args.JsonRestore())["metadata"]
  _check_metadata(path, metadata, template)
  abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _arrays(template))
  arrays = read(state=ocp.args.StandardRestore(abstract))["state"]
  _check_arrays(path, arrays, metadata.get("crc32"))
  return template.replace(**arrays)


def restore_checkpoint(directory: epath.PathLike, template: TrainState) -> TrainState:
  """Restores a ``save_checkpoint`` folder into ``template``, a ``TrainState`` of the same
  architecture, ensemble size and optimizer whose static fields are kept.

  Raises:
    DamagedCheckpointError: (a ValueError) no checkpoint at ``directory``, or a damaged one.
    ValueError: saved from another architecture or parameter shapes (ensemble size).
  """
  path = _local_path(directory)
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
    return _read(path, lambda args: checkpointer.restore(path, args=args), template)


_QUIET_DIRECTORIES: set[str] = set()


def _quiet_failed_reads(directory) -> None:
  """Drops asyncio's "exception was never retrieved" tracebacks of failed tensorstore reads in
  ``directory`` (a damaged checkpoint is told once, by ``latest``'s warning); in place before
  the restore, since the garbage collector may report them during it."""
  if not _QUIET_DIRECTORIES:
    logging.getLogger("asyncio").addFilter(
      lambda log: not any(d in log.getMessage() for d in _QUIET_DIRECTORIES)
    )
  _QUIET_DIRECTORIES.add(os.fspath(directory))


class RunCheckpoints(contextlib.AbstractContextManager):
  """The checkpoint of a training run's last finished epoch, by orbax's ``CheckpointManager``.

  Every process creates it with the same ``directory`` (local or a URL) and calls ``latest``
  and ``save`` alike: process 0 writes, all read. Use it as a context manager, or ``close``
  it. Older ``epoch_N/`` folders are read while the manager holds no checkpoint of its own.
  """

  def __init__(self, directory: epath.PathLike):
    files.check_usable(directory, "directory")
    self.directory = _local_path(directory)
    self._discard_unfinished()  # orbax's own cleanup runs in a thread: this one has ended
    # Synchronous: a save has ended when ``save`` returns.
    options = ocp.CheckpointManagerOptions(
      max_to_keep=1, enable_async_checkpointing=False, cleanup_tmp_directories=True
    )
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=("state", "metadata")
    )
    self._failed = False

  def latest(self, template: TrainState) -> tuple[int, TrainState]:
    """``(epoch, state)`` of the last saved epoch, or ``(0, template)`` when none is readable.

    A damaged checkpoint is set aside as ``<epoch>.damaged`` with one warning, and the one
    before it is read instead, so the caller trains its epoch again.

    Raises:
      ValueError: the checkpoint is of another architecture or parameter shapes.
    """
    _quiet_failed_reads(self.directory)
    while (epoch := self._manager.latest_step()) is not None:
      path = self.directory / str(epoch)
      try:
        return epoch, _read(path, lambda args: self._manager.restore(epoch, args=args), template)
      except DamagedCheckpointError as e:
        self._set_aside(e)
    prefix = len(_LEGACY_PREFIX)  # no checkpoint of the manager's own: the older layout's
    found = self.directory.glob(f"{_LEGACY_PREFIX}*")
    epochs = [int(p.name[prefix:]) for p in found if p.name[prefix:].isdigit() and p.is_dir()]
    for newest in sorted(epochs, reverse=True):
      try:
        return newest, restore_checkpoint(self.directory / f"{_LEGACY_PREFIX}{newest}", template)
      except DamagedCheckpointError as e:
        self._set_aside(e)
    return 0, template

  def _set_aside(self, damage: DamagedCheckpointError) -> None:
    """Renames a damaged checkpoint (process 0; the others wait for it) and says so."""
    path = damage.path
    aside = path.with_name(path.name + DAMAGED_SUFFIX)
    for number in range(1, 1000):  # an epoch damaged again keeps the one set aside before
      if not aside.exists():
        break
      aside = path.with_name(f"{path.name}{DAMAGED_SUFFIX}.{number}")
    if jax.process_index() == 0:
      path.rename(aside)
    ocp.multihost.sync_global_processes(f"top1_jax: set aside {path}")
    self._manager.reload()  # its list of saved epochs no longer holds this one
    absl_logging.warning(
      "checkpoint %s is damaged (%s); set aside as %s, and its epoch is trained again",
      path, damage.why, aside.name,
    )  # fmt: skip

  def save(self, epoch: int, state: TrainState) -> None:
    """Saves ``state`` (the same in every process) as ``epoch``, after the latest saved one,
    then deletes the previous epoch's checkpoint.

    Raises:
      OSError: the system refused the write (``errno.ENOSPC``: a full disk), naming the
        folder; the unfinished save is removed and the previous checkpoint kept.
      ValueError: any other failure of the save, in one line.
    """
    latest = self._manager.latest_step() or 0
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch <= latest:
      raise ValueError(
        f"epoch: expected an integer after the latest saved epoch {latest}, got {epoch!r}"
      )
    try:
      self._manager.save(int(epoch), args=_save_args(state))
    except Exception as e:  # noqa: BLE001 -- orbax and tensorstore raise plain exceptions
      self._failed = True
      with contextlib.suppress(Exception):  # its threads may still be writing
        self._manager.wait_until_finished()
      self._discard_unfinished()
      raise _save_error(self.directory / str(epoch), e) from e

  def _discard_unfinished(self) -> None:
    """Removes a failed save's temporary folders: again at ``close``, since tensorstore's
    threads may still write there in between."""
    if jax.process_index() != 0 or not isinstance(self.directory, pathlib.Path):
      return
    for partial in self.directory.glob(f"*{_TMP_SUFFIX}*"):
      shutil.rmtree(partial, ignore_errors=True)

  def close(self) -> None:
    """Waits for pending writes and releases orbax's threads."""
    try:
      self._manager.close()
    finally:
      if self._failed:
        self._discard_unfinished()

  def __exit__(self, *exc_info) -> None:
    self.close()
