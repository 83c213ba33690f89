"""Checkpoints of a ``train.TrainState`` (one network or a stacked ensemble), by orbax.

* ``save_checkpoint``: the arrays, plus the architecture (``models.architecture``)
  and every parameter's shape.
* ``restore_checkpoint``: into the structure of a template state; restoring into
  another architecture, ensemble size or parameter shapes raises ``ValueError``
  that says what differs.
"""

import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from top1_jax import models
from top1_jax.train import TrainState

__all__ = ["save_checkpoint", "restore_checkpoint"]

# Written into every checkpoint and checked on restore. It names the module that
# first wrote the format; changing it would make existing checkpoints unreadable.
_FORMAT = "top1_jax.train.TrainState/1"


def _shapes(state: TrainState) -> dict[str, list[int]]:
  tree = {"params": state.params, "model_state": state.model_state}
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path): list(np.shape(leaf)) for path, leaf in flat}


def _arrays(state: TrainState) -> dict[str, Any]:
  return {
    "step": state.step,
    "params": state.params,
    "model_state": state.model_state,
    "opt_state": state.opt_state,
  }


def save_checkpoint(
  directory: str | pathlib.Path, state: TrainState, *, overwrite: bool = False
) -> pathlib.Path:
  """Saves a (single or ensemble) ``TrainState`` with orbax.

  Besides the arrays it stores the architecture (``models.architecture``) and
  every parameter's shape, which ``restore_checkpoint`` checks.

  Args:
    directory: where to write (created; must not exist unless ``overwrite``).
    state: the state to save.
    overwrite: replace an existing checkpoint at ``directory``.

  Returns:
    The absolute checkpoint path.
  """
  path = pathlib.Path(directory).expanduser().resolve()
  if path.exists() and not overwrite:
    raise ValueError(f"directory: {path} exists; pass overwrite=True to replace it")
  metadata = {
    "format": _FORMAT,
    "architecture": models.architecture(state.model),
    "dropout_rate": state.dropout_rate,
    "shapes": _shapes(state),
  }
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
    checkpointer.save(
      path,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(_arrays(state)),
        metadata=ocp.args.JsonSave(metadata),
      ),
      force=overwrite,
    )
  return path


def _shape_mismatch(path: pathlib.Path, saved: dict, wanted: dict) -> str:
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


def _check_metadata(path: pathlib.Path, metadata: dict, template: TrainState) -> None:
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


def restore_checkpoint(directory: str | pathlib.Path, template: TrainState) -> TrainState:
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
  path = pathlib.Path(directory).expanduser().resolve()
  if not (path / "metadata").is_dir() or not (path / "state").is_dir():
    raise ValueError(f"directory: no checkpoint saved by save_checkpoint at {path}")
  # Checked before orbax opens it: with an OCDBT manifest missing, orbax's reader
  # fails from worker threads and prints a traceback per array besides its error.
  for shard in (path / "state").glob("ocdbt.process_*"):
    for manifest in (path / "state" / "manifest.ocdbt", shard / "manifest.ocdbt"):
      if not manifest.is_file():
        raise ValueError(
          f"directory: the checkpoint at {path} is damaged ({manifest.name} is missing)"
        )
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
    metadata = _orbax_read(path, checkpointer, metadata=ocp.args.JsonRestore())["metadata"]
    _check_metadata(path, metadata, template)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _arrays(template))
    arrays = _orbax_read(path, checkpointer, state=ocp.args.StandardRestore(abstract))["state"]
  return template.replace(**arrays)


def _orbax_read(path: pathlib.Path, checkpointer, **args):
  """``checkpointer.restore`` with orbax's errors for damaged files as one ValueError.

  A killed write or a disk error leaves files orbax cannot parse; it raises bare
  ``Exception``s (and tensorstore errors) then. The caller can set the checkpoint
  aside and retrain instead of ending in a wall of text.
  """
  try:
    return checkpointer.restore(path, args=ocp.args.Composite(**args))
  except Exception as e:  # noqa: BLE001 -- orbax raises plain Exception for corrupt files
    first = " ".join(str(e).split())[:200]
    raise ValueError(
      f"directory: the checkpoint at {path} is damaged ({type(e).__name__}: {first})"
    ) from None
