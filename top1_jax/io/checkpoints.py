"""Checkpoints of a ``train.TrainState`` (one network or a stacked ensemble), by orbax.

* ``RunCheckpoints``: a training run's checkpoints through orbax's
  ``CheckpointManager``: ``save(epoch, state)`` keeps the last epoch only,
  ``latest(template)`` resumes from it. Every process of a run calls both alike;
  orbax writes from process 0 and makes each checkpoint appear whole or not at all.
* ``save_checkpoint`` / ``restore_checkpoint``: one checkpoint in one folder.

Both store, beside the arrays, the architecture (``models.architecture``) and
every parameter's shape, and refuse to restore into a template of another
architecture, ensemble size or parameter shapes with a ``ValueError`` that says
what differs.
"""

import contextlib
import os
import pathlib
import re
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from top1_jax.engine import models
from top1_jax.engine.train import TrainState
from top1_jax.io import files

__all__ = ["RunCheckpoints", "save_checkpoint", "restore_checkpoint"]

# Written into every checkpoint and checked on restore. A fixed name, not where
# TrainState is defined: changing it would make existing checkpoints unreadable.
_FORMAT = "top1_jax.engine.train.TrainState/1"
# The folders ``save_checkpoint`` writes, one per epoch: ``epoch_<N>``.
_LEGACY_PREFIX = "epoch_"
# How orbax names the folder of a save in progress (``<step>.orbax-checkpoint-tmp...``).
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


def _save_error(path, error: Exception) -> Exception:
  """A failed save as one error: an ``OSError`` naming ``path`` when the system said why
  (tensorstore reports a full disk as ``ValueError: ... [os_error_code='28']``)."""
  text = " ".join(str(error).split())
  if isinstance(error, OSError) and error.errno is not None:
    return OSError(error.errno, error.strerror, os.fspath(error.filename or path))
  code = re.search(r"os_error_code='(\d+)'", text)
  if code:
    return OSError(int(code.group(1)), os.strerror(int(code.group(1))), os.fspath(path))
  return ValueError(
    f"directory: the checkpoint {path} could not be saved ({type(error).__name__}: {text[:200]})"
  )


def _shapes(state: TrainState) -> dict[str, list[int]]:
  tree = {"params": state.params, "model_state": state.model_state}
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in flat}


def _metadata(state: TrainState) -> dict[str, Any]:
  return {
    "format": _FORMAT,
    "architecture": models.architecture(state.model),
    "dropout_rate": state.dropout_rate,
    "shapes": _shapes(state),
  }


def _arrays(state: TrainState) -> dict[str, Any]:
  return {
    "step": state.step,
    "params": state.params,
    "model_state": state.model_state,
    "opt_state": state.opt_state,
  }


def _save_args(state: TrainState) -> ocp.args.Composite:
  # Host copies: orbax writes NumPy arrays from process 0 only, so every process
  # may pass its own copy of a state (local, or replicated over all devices).
  arrays = jax.tree_util.tree_map(np.asarray, _arrays(state))
  return ocp.args.Composite(
    state=ocp.args.StandardSave(arrays), metadata=ocp.args.JsonSave(_metadata(state))
  )


def _local_path(directory: epath.PathLike) -> pathlib.Path | epath.Path:
  """An absolute path for a local folder; a URL as an ``epath.Path``, unchanged."""
  path = files.as_path(directory)
  return path.expanduser().resolve() if isinstance(path, pathlib.Path) else path


def save_checkpoint(
  directory: epath.PathLike, state: TrainState, *, overwrite: bool = False
) -> pathlib.Path | epath.Path:
  """Saves a (single or ensemble) ``TrainState`` with orbax into ``directory``.

  Args:
    directory: where to write (created; must not exist unless ``overwrite``).
    state: the state to save.
    overwrite: replace an existing checkpoint at ``directory``.

  Returns:
    The absolute checkpoint path (an ``epath.Path`` for a URL).
  """
  path = _local_path(directory)
  if path.exists() and not overwrite:
    raise ValueError(f"directory: {path} exists; pass overwrite=True to replace it")
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
    checkpointer.save(path, args=_save_args(state), force=overwrite)
  return path


def _shape_mismatch(path, saved: dict, wanted: dict) -> str:
  """The error message for parameter shapes that differ, naming the likely cause."""
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


def _check_metadata(path, metadata: dict, template: TrainState) -> None:
  """The one rule for what a checkpoint may be restored into."""
  if metadata.get("format") != _FORMAT:
    raise ValueError(
      f"directory: {path} has format {metadata.get('format')!r}, expected {_FORMAT!r}"
    )
  saved, wanted = metadata["architecture"], models.architecture(template.model)
  if saved != wanted:
    fields = sorted(k for k in saved.keys() | wanted.keys() if saved.get(k) != wanted.get(k))
    detail = ", ".join(f"{k}: saved {saved.get(k)!r}, template {wanted.get(k)!r}" for k in fields)
    raise ValueError(f"template: architecture mismatch with the checkpoint at {path} ({detail})")
  if metadata["shapes"] != _shapes(template):
    raise ValueError(_shape_mismatch(path, metadata["shapes"], _shapes(template)))


def _check_files(path) -> None:
  """Refuses a checkpoint folder that lacks its parts, before orbax opens it.

  With an OCDBT manifest missing, orbax's reader fails from worker threads and
  prints a traceback per array besides its error.
  """
  if not (path / "metadata").is_dir() or not (path / "state").is_dir():
    raise ValueError(f"directory: no checkpoint at {path} (no metadata/ and state/ folders)")
  for shard in (path / "state").glob("ocdbt.process_*"):
    for manifest in (path / "state" / "manifest.ocdbt", shard / "manifest.ocdbt"):
      if not manifest.is_file():
        raise ValueError(
          f"directory: the checkpoint at {path} is damaged ({manifest.name} is missing)"
        )


def _read(path, restore, template: TrainState) -> TrainState:
  """Checks the metadata, then reads the arrays in the structure of ``template``.

  ``restore(args)`` is the orbax restore of the checkpoint at ``path``. A killed
  write or a disk error leaves files orbax cannot parse; it raises bare
  ``Exception``s (and tensorstore errors) then, turned here into one
  ``ValueError``, so the caller can set the checkpoint aside and retrain.
  """

  def read(**args):
    try:
      return restore(ocp.args.Composite(**args))
    except Exception as e:  # noqa: BLE001 -- orbax raises plain Exception for corrupt files
      first = " ".join(str(e).split())[:200]
      raise ValueError(
        f"directory: the checkpoint at {path} is damaged ({type(e).__name__}: {first})"
      ) from None

  _check_metadata(path, read(metadata=ocp.args.JsonRestore())["metadata"], template)
  abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _arrays(template))
  return template.replace(**read(state=ocp.args.StandardRestore(abstract))["state"])


def restore_checkpoint(directory: epath.PathLike, template: TrainState) -> TrainState:
  """Restores a checkpoint into the structure of ``template``.

  Args:
    directory: a path written by ``save_checkpoint``.
    template: a ``TrainState`` of the same architecture, ensemble size and
      optimizer (e.g. fresh from ``train.create_train_state`` /
      ``train.init_ensemble``); its static fields (model, tx, dropout_rate) are
      kept.

  Returns:
    The restored ``TrainState``.

  Raises:
    ValueError: if there is no checkpoint at ``directory``, or it was saved from
      another architecture or with other parameter shapes (e.g. another
      ensemble size).
  """
  path = _local_path(directory)
  _check_files(path)
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
    return _read(path, lambda args: checkpointer.restore(path, args=args), template)


class RunCheckpoints:
  """The checkpoint of a training run's last finished epoch, by orbax's ``CheckpointManager``.

  Every process of the run creates it with the same ``directory`` (local, or a
  URL such as ``gs://bucket/run``) and calls ``latest`` and ``save`` alike:
  process 0 writes, all read. A save is atomic: a run killed while saving
  resumes from the previous epoch. Use it as a context manager, or ``close`` it.

  A folder of ``save_checkpoint``'s layout (``epoch_N/`` folders) is read while
  the manager holds no checkpoint of its own: its newest one resumes as epoch N.
  The next ``save`` goes beside it.
  """

  def __init__(self, directory: epath.PathLike):
    files.check_usable(directory, "directory")
    self.directory = _local_path(directory)
    self._discard_unfinished()  # orbax's own cleanup runs in a thread: this one has ended
    # Synchronous: a save has ended when ``save`` returns. The cleanup removes the
    # temporary folder of a save that was killed.
    options = ocp.CheckpointManagerOptions(
      max_to_keep=1, enable_async_checkpointing=False, cleanup_tmp_directories=True
    )
    self._manager = ocp.CheckpointManager(
      self.directory, options=options, item_names=("state", "metadata")
    )
    self._failed = False

  def latest(self, template: TrainState) -> tuple[int, TrainState]:
    """The last saved epoch and its state, in the structure of ``template``.

    Args:
      template: a ``TrainState`` as ``restore_checkpoint`` takes.

    Returns:
      ``(epoch, state)``, or ``(0, template)`` when nothing was saved.

    Raises:
      ValueError: the checkpoint is damaged, or of another architecture,
        ensemble size or parameter shapes (the message says what differs).
    """
    epoch = self._manager.latest_step()
    if epoch is None:
      return self._latest_legacy(template)
    path = self.directory / str(epoch)
    _check_files(path)
    return epoch, _read(path, lambda args: self._manager.restore(epoch, args=args), template)

  def _latest_legacy(self, template: TrainState) -> tuple[int, TrainState]:
    prefix = len(_LEGACY_PREFIX)
    epochs = [
      int(p.name[prefix:])
      for p in self.directory.glob(f"{_LEGACY_PREFIX}*")
      if p.name[prefix:].isdigit() and p.is_dir()
    ]
    if not epochs:
      return 0, template
    newest = max(epochs)
    return newest, restore_checkpoint(self.directory / f"{_LEGACY_PREFIX}{newest}", template)

  def save(self, epoch: int, state: TrainState) -> None:
    """Saves ``state`` as epoch ``epoch`` and then deletes the previous epoch's checkpoint.

    Args:
      epoch: the finished epoch, after the latest saved one.
      state: the state to save (the same in every process).

    Raises:
      OSError: the system refused the write (``errno.ENOSPC`` for a full disk),
        naming the checkpoint's folder. The unfinished save's temporary folders
        are removed first; the previous epoch's checkpoint is kept.
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
    """Removes the temporary folders of a save that failed (a full disk, most often).

    Done after the failure, again at ``close`` (tensorstore's threads may still write
    there in between) and when the next ``RunCheckpoints`` opens the folder.
    """
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

  def __enter__(self) -> "RunCheckpoints":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
