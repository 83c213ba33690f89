"""The predictions file (``.npz``) that any model can write, and human label frequencies. Its
fields are ``Predictions``' attributes (``score_<name>`` for each score, ``meta`` as a JSON
string); loading checks each one and errors name the file and the field."""

import dataclasses
import io
import os
import pathlib
import re
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

from top1_jax.core import scores, validation
from top1_jax.io import files, prediction_checks
from top1_jax.io.prediction_checks import ARRAY_FIELDS, SCORE_PREFIX
from top1_jax.version import __version__


@dataclasses.dataclass(frozen=True, eq=False)
class Predictions:
  """A model's outputs on one split; validated on construction (and by ``dataclasses.replace``).

  Arrays are stored as numpy: labels int32, the rest float32.

  Attributes:
    labels: [N] int, in [0, K).
    logits: [S, N, K] float (S samples: MC dropout or ensemble members; a [N, K] array is
      taken as S = 1), or None.
    mean_probs: [N, K] float, rows summing to 1, or None. At least one of
      ``logits`` and ``mean_probs`` is required; with both, N and K agree.
    scores: name -> [N] float precomputed uncertainty scores (names are letters, digits
      and underscores).
    human_probs: [N, K] float human label frequencies (CIFAR-10H), or None.
    meta: JSON-serializable dict (dataset, split, model, method, seed, version, ...). A
      shifted test set adds ``shift`` (``rotate``, a corruption, an OOD set's name) and
      ``severity`` (>= 0); ``ood: true`` marks inputs outside the label set, whose
      ``labels`` are placeholders, never scored.
  """

  labels: np.ndarray
  logits: np.ndarray | None = None
  mean_probs: np.ndarray | None = None
  scores: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
  human_probs: np.ndarray | None = None
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    labels = prediction_checks.labels_field(self.labels)
    num_examples = labels.shape[0]
    if self.logits is None and self.mean_probs is None:
      raise ValueError(
        "logits/mean_probs: expected logits [S, N, K] or mean_probs [N, K], got neither"
      )
    logits = mean_probs = human_probs = num_classes = None
    if self.logits is not None:
      logits = prediction_checks.logits_field(self.logits, num_examples)
      num_classes = logits.shape[2]
    if self.mean_probs is not None:
      mean_probs = prediction_checks.probs_field("mean_probs", self.mean_probs, num_examples)
      if logits is not None:
        if mean_probs.shape[1] != num_classes:
          raise ValueError(
            f"mean_probs: expected K={num_classes} (from logits) columns, got shape"
            f" {mean_probs.shape}"
          )
        prediction_checks.check_agreement(logits, mean_probs)
      num_classes = mean_probs.shape[1]
    if num_classes < 2:
      field = "logits" if logits is not None else "mean_probs"
      raise ValueError(f"{field}: expected at least 2 classes, got K={num_classes}")
    labels = validation.labels_array("labels", labels, num_classes, host=True)
    scores = prediction_checks.scores_fields(self.scores, num_examples)
    if self.human_probs is not None:
      human_probs = prediction_checks.probs_field("human_probs", self.human_probs, num_examples)
      if human_probs.shape[1] != num_classes:
        raise ValueError(
          f"human_probs: expected K={num_classes} columns, got shape {human_probs.shape}"
        )
    meta = prediction_checks.checked_meta(self.meta)
    checked = (labels, logits, mean_probs, scores, human_probs, meta)  # in the fields' order
    for field, value in zip(dataclasses.fields(self), checked, strict=True):
      object.__setattr__(self, field.name, value)

  @property
  def num_examples(self) -> int:
    """N."""
    return int(self.labels.shape[0])

  @property
  def num_classes(self) -> int:
    """K."""
    source = self.logits if self.logits is not None else self.mean_probs
    return int(source.shape[-1])

  @property
  def num_samples(self) -> int | None:
    """S, or None when only ``mean_probs`` is kept."""
    return None if self.logits is None else int(self.logits.shape[0])


def save_predictions(
  path: epath.PathLike, predictions: Predictions, *, compress: bool = False
) -> pathlib.Path | epath.Path:
  """Writes a predictions file atomically; returns the path written. ``meta["version"]``
  defaults to this library's version; logits that look like probabilities are refused."""
  if not isinstance(predictions, Predictions):
    raise ValueError(
      "predictions: expected a top1_jax.io.predictions.Predictions, got"
      f" {type(predictions).__name__}"
    )
  if predictions.logits is not None:
    fix = "store them as mean_probs (or their logarithms as logits)"
    validation.refuse_probabilities("logits", predictions.logits, fix)
  meta = {"version": __version__, **predictions.meta}
  arrays = {"labels": predictions.labels, "meta": np.asarray(prediction_checks.meta_json(meta))}
  arrays |= {k: v for k in ARRAY_FIELDS[1:] if (v := getattr(predictions, k)) is not None}
  arrays |= {f"{SCORE_PREFIX}{name}": score for name, score in predictions.scores.items()}
  save = np.savez_compressed if compress else np.savez
  return files.atomic_write(path, lambda file: save(file, **arrays))


_MAGIC = {
  b"\x93NUMPY": "a NumPy .npy array",
  b"PK\x03\x04": "a zip archive",
  b"\x1f\x8b": "gzip-compressed data",
  b"\x80": "a Python pickle",
}


def _what(head: bytes) -> str:
  """What a file starting with ``head`` is, in words."""
  if not head:
    return "an empty file"
  other = "text" if head.isascii() and b"\0" not in head else "binary data of another format"
  return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), other)


def _np_load(path: pathlib.Path | epath.Path, kind: str, expected: str):
  """``np.load`` of a regular file without pickles: an array or an ``NpzFile`` (the caller
  closes it). Never NumPy's hint to allow pickles, which would run a file's code."""
  with files.open_regular(path) as file:
    head = file.read(64)
  # np.load wants a seekable file: a local path as is, an object read into memory.
  source = path if isinstance(path, pathlib.Path) else io.BytesIO(path.read_bytes())
  try:
    return np.load(source, allow_pickle=False)
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    if "pickle" in str(e):  # NumPy's guess for any file that is neither .npz nor .npy
      e = f"it is {_what(head)}; expected {expected}"
    raise ValueError(f"{path}: not a readable {kind} ({e})") from None


def load_predictions(path: epath.PathLike) -> Predictions:
  """Reads and validates a predictions file, local or a URL.

  Raises:
    FileNotFoundError: no such file.
    ValueError: not an ``.npz``, a bad, missing or repeated field, a corrupt member, or a
      zip bomb (over ``prediction_checks.MAX_INFLATED_BYTES``: ``stream.PredictionsReader``
      reads such a file a block at a time); naming the file and field.
  """
  path = files.as_path(path)
  if not path.exists():
    raise FileNotFoundError(f"{path}: predictions file not found")
  archive = _np_load(
    path, ".npz predictions file", "an .npz archive of named arrays, as save_predictions writes"
  )
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise ValueError(f"{path}: expected an .npz archive of named arrays, got a single array")
  fields: dict[str, Any] = {"scores": {}}  # Predictions' keyword arguments
  with archive:
    for key, info in prediction_checks.archive_members(path, archive.zip).items():
      prediction_checks.check_inflation(path, key, info)
      prediction_checks.member_header(path, key, archive.zip, info)
      with prediction_checks.reading(path, key), archive.zip.open(info) as file:
        value = np.lib.format.read_array(file, allow_pickle=False)
        file.read()  # to the member's end, where zipfile compares the CRC-32
      with files.named(path):
        if key == "meta":
          fields["meta"] = prediction_checks.read_meta(value)
        elif key.startswith(SCORE_PREFIX):
          fields["scores"][key.removeprefix(SCORE_PREFIX)] = value
        else:
          prediction_checks.check_field_name(key)
          fields[key] = value
  if "labels" not in fields:
    raise ValueError(f"{path}: labels: missing field (int [N] class labels)")
  with files.named(path):
    return Predictions(**fields)


def _load_npy(name: str, path: epath.PathLike, expected: str) -> np.ndarray:
  """One ``.npy`` array of ``expected``; errors start with ``name`` (the argument or flag)."""
  path = files.as_path(path)
  if not path.exists():
    raise FileNotFoundError(f"{name}: no such file: {path}")
  with files.named(name):
    value = _np_load(path, ".npy array", f"a .npy array of {expected}, as np.save writes")
  if not isinstance(value, np.ndarray):
    value.close()
    raise ValueError(f"{name}: {path} is an .npz archive; expected one .npy array of {expected}")
  return value


def from_arrays(
  *,
  labels: epath.PathLike,
  logits: epath.PathLike | None = None,
  probs: epath.PathLike | None = None,
  array: epath.PathLike | None = None,
  meta: Mapping[str, Any] | None = None,
) -> Predictions:
  """``Predictions`` from plain ``.npy`` files, the way any framework can save them.

  Exactly one of ``logits``, ``probs`` and ``array`` is given; errors name it and its file.

  Args:
    labels: path of an int [N] array.
    logits: path of [N, K] logits or [S, N, K] samples; refused if they look like
      probabilities.
    probs: path of [N, K] or [S, N, K] probabilities; [S, N, K] are stored as
      log-probabilities, [N, K] as ``mean_probs``.
    array: path of either, told apart by its rows (``scores.input_kind``).
    meta: the file's ``meta``; ``method`` defaults to "plain" or "samples".
  """
  if sum(x is not None for x in (logits, probs, array)) != 1:
    raise ValueError("logits/probs/array: expected exactly one of them")
  if array is not None:
    values = _load_npy("array", array, "float [N, K] or [S, N, K] logits or probabilities")
    try:
      kind = scores.input_kind("array", prediction_checks.float_field("array", values, (2, 3)))
    except ValueError as e:
      raise ValueError(
        f"{e} (in {array}; --config.input_kind=logits or probs says which)"
      ) from None
    return from_arrays(labels=labels, meta=meta, **{kind: array})
  given = "logits" if probs is None else "probs"
  paths = {"labels": labels, given: logits if probs is None else probs}
  values = _load_npy(given, paths[given], "float [N, K] or [S, N, K] " + given)
  fields: dict[str, Any] = {"labels": _load_npy("labels", labels, "int [N] class labels")}
  if probs is not None:
    values = prediction_checks.float_field("probs", values, (2, 3))
    validation.probability_array("probs", values, (2, 3), sums_to_one=True)
    if values.ndim == 3:
      fields["logits"] = scores.log_probs_from_probs(values)
    else:
      fields["mean_probs"] = values
  else:
    fields["logits"] = values
  samples = values.ndim == 3 and values.shape[0] > 1
  fields["meta"] = {"method": "samples" if samples else "plain", **(meta or {})}
  try:
    predictions = Predictions(**fields)
  except ValueError as e:  # name the array the user gave and its file, not the field stored
    message = re.sub(r"^(logits|mean_probs):", f"{given}:", str(e))
    where = paths.get(message.split(":", 1)[0])
    raise ValueError(message if where is None else f"{message} (in {where})") from None
  if probs is None:  # probabilities run as logits give other numbers, silently
    fix = f"pass them as probs (--config.input_kind=probs) (in {logits})"
    validation.refuse_probabilities("logits", predictions.logits, fix, given=values)
  return predictions


def load_human_probs(
  path: epath.PathLike, *, num_examples: int | None = None, num_classes: int | None = None
) -> np.ndarray:
  """[N, K] float32 human label probabilities from a ``.npy`` (CIFAR-10H ``cifar10h-probs.npy``:
  the original CIFAR-10 test order, TFDS ``cifar10`` sorted by ``id``), rows in the
  predictions' example order; ``num_examples`` and ``num_classes``, when given, are checked.
  """
  path = files.as_path(path)
  array = _load_npy("human_probs", path, "float [N, K] human label probabilities")
  if array.ndim == 2 and np.issubdtype(array.dtype, np.number) and array.size:
    sums = array.sum(axis=1, dtype=np.float64)
    if array.min() >= 0 and np.all(array == np.round(array)) and sums.max() > 1.5:
      raise ValueError(
        f"{path}: human_probs: looks like annotator counts (row sums up to"
        f" {sums.max():g}); divide each row by its sum to get probabilities"
      )
  with files.named(path):
    probs = prediction_checks.float_field("human_probs", array, (2,))
    wanted = {"num_examples": num_examples, "num_classes": num_classes}
    for (name, want), got in zip(wanted.items(), probs.shape, strict=True):
      if want is not None and want != got:
        raise ValueError(f"human_probs: expected {name}={want}, got shape {probs.shape}")
    return prediction_checks.probs_field("human_probs", probs, probs.shape[0])


def attach_human_probs(
  predictions_path: epath.PathLike,
  human_probs: epath.PathLike | np.ndarray,
  *,
  output_path: epath.PathLike | None = None,
) -> pathlib.Path | epath.Path:
  """Adds [N, K] human label probabilities (an array or a ``.npy`` path) to a predictions
  file, written to ``output_path`` (None: replaces ``predictions_path``); returns the path."""
  predictions = load_predictions(predictions_path)
  if isinstance(human_probs, (str, os.PathLike)):
    human_probs = load_human_probs(
      human_probs, num_examples=predictions.num_examples, num_classes=predictions.num_classes
    )
  updated = dataclasses.replace(predictions, human_probs=human_probs)
  target = predictions_path if output_path is None else output_path
  return save_predictions(target, updated)
