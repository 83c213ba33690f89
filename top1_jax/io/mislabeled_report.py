"""The mislabelled-image finder's files: a predictions file's score and images in, the report
out (``mislabeled.report`` turns scores into rows)."""

import csv
import io
from typing import NamedTuple

import jax
import numpy as np
from etils import epath

from top1_jax.core import events, scores
from top1_jax.core.validation import SettingError
from top1_jax.evaluation import mislabeled
from top1_jax.io import datasets, files
from top1_jax.io import predictions as predictions_lib
from top1_jax.io.splits import DatasetSplit

_NEEDS = {
  "samples": " (needs MC-dropout or ensemble logits)",
  "human_probs": " (needs human labels)",
}


class Inputs(NamedTuple):
  """What the finder searches: one predictions file's score and event, and its images.

  Attributes:
    predictions: the loaded file.
    u: [N] float32, the requested score.
    correct: [N] bool, whether the Top-k prediction is correct.
    predicted: [N] int, the Top-1 class.
    images: the split the predictions were made on, in the same order.
  """

  predictions: predictions_lib.Predictions
  u: np.ndarray
  correct: np.ndarray
  predicted: np.ndarray
  images: DatasetSplit


def file_score(
  predictions: predictions_lib.Predictions, score: str, k: int
) -> tuple[jax.Array, np.ndarray]:
  """([N, K] log-probabilities, [N] float32 scores) for the Top-k event; ``score`` is a
  ``scores.REGISTRY`` name or a stored score's (which wins), ``neg_log_topk_mass`` takes k.

  Raises:
    SettingError: the score cannot be had from this file; says what it needs
      (e.g. MC-dropout samples) and which scores can.
  """
  name = scores.for_event(score, k)
  log_probs, available, _ = scores.from_predictions(
    logits=predictions.logits,
    mean_probs=predictions.mean_probs,
    stored_scores=predictions.scores,
    human_probs=predictions.human_probs,
    topk=(k,),
  )
  if name not in available:
    known = scores.lookup(name)
    needs = _NEEDS.get(known.inputs, "") if known else ""
    raise SettingError(
      f"score: {name!r} is not available for this file{needs}; available: "
      + ", ".join(sorted(available))
    )
  return log_probs, np.asarray(available[name], np.float32)


def check_images(
  images: DatasetSplit, predictions: predictions_lib.Predictions, file_name: str = "the file"
) -> DatasetSplit:
  """``images`` if they are the examples the predictions were made on, in order: a file of
  another dataset or order would otherwise caption the wrong pictures without an error.

  Raises:
    SettingError (``predictions: ...``): the first way the two differ (count,
      classes, or how many labels differ and the first such index).
  """
  labels = np.asarray(images.labels)
  if labels.shape != predictions.labels.shape:
    problem = f"{predictions.num_examples} predictions vs {labels.shape[0]} images"
  elif images.num_classes != predictions.num_classes:
    problem = f"{predictions.num_classes} classes vs {images.num_classes}"
  else:
    differ = np.flatnonzero(labels != predictions.labels)
    if not differ.size:
      return images
    problem = f"labels differ at {differ.size} examples, the first at index {differ[0]}"
  raise SettingError(
    f"predictions: {file_name} does not match the {images.name} {images.split} split "
    f"({problem}): the file is of another dataset or example order"
  )


def load_inputs(
  path: epath.PathLike,
  *,
  score: str = "pmax",
  topk: int = 1,
  n_bins: int = 20,
  dataset: str | None = None,
  data_dir: epath.PathLike | None = None,
) -> Inputs:
  """A predictions file's score, Top-k event and images, each checked against the file.

  The images are the file's meta ``split`` (default ``test``), cut to its
  ``limit_test`` examples (default: as many as it predicts).

  Args:
    score: the score to bin (``file_score``).
    topk: the event, 1 <= topk <= K.
    n_bins: the bins to be fitted, at most N (checked before the images are read).
    dataset: the images' dataset; needed when the file's meta names none, and
      must agree with it otherwise.
    data_dir: IDX files or a TFDS data dir; when given, the only place read.

  Raises:
    SettingError: a setting that does not fit the file (named first).
    DataUnavailableError, ValueError: as ``load_predictions`` and ``load_dataset``.
  """
  predictions = predictions_lib.load_predictions(path)
  num, num_classes = predictions.num_examples, predictions.num_classes
  file_name = files.as_path(path).name
  if not 1 <= topk <= num_classes:
    raise SettingError(
      f"topk: expected 1 <= k <= {num_classes} (the classes of {file_name}), got {topk}"
    )
  if n_bins > num:
    raise SettingError(
      f"n_bins: {n_bins} bins need at least that many examples; {file_name} has {num}"
    )
  log_probs, u = file_score(predictions, score, topk)
  correct = np.asarray(events.topk_correct(log_probs, predictions.labels, k=topk))
  meta = predictions.meta
  if dataset and meta.get("dataset") is not None and meta["dataset"] != dataset:
    raise SettingError(f"dataset: {file_name} is of dataset {meta['dataset']!r}, not {dataset!r}")
  dataset = dataset or meta.get("dataset")
  if not dataset:
    raise SettingError(
      f"dataset: {file_name} names no dataset in its meta; pass dataset (and data_dir)"
    )
  split = meta.get("split") or "test"
  limit = meta.get("limit_test") or num
  images = datasets.load_dataset(dataset, split, data_dir=data_dir, limit=limit, fallback=False)
  check_images(images, predictions, file_name)
  predicted = np.asarray(np.argmax(log_probs, axis=-1))
  return Inputs(predictions, u, correct, predicted, images)


def write_report(
  out_dir: epath.PathLike, report: mislabeled.Report, summary: dict
) -> tuple[epath.Path, epath.Path]:
  """Writes ``mislabeled.csv`` (the rows, with a header even when empty) and
  ``mislabeled.json`` (``summary``), atomically; returns their paths."""
  out_dir = files.as_path(out_dir)
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=mislabeled.COLUMNS)
  writer.writeheader()
  writer.writerows(report.rows)
  csv_path = files.write_bytes(out_dir / "mislabeled.csv", buffer.getvalue().encode())
  return csv_path, files.write_json(out_dir / "mislabeled.json", summary)
