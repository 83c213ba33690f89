"""Confident errors: wrong predictions in the most confident bins (paper supplement).

``confident_errors`` finds them for any score, reading which end is confident off the
fitted bins.
"""

import fractions
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, validation

COLUMNS = ("rank", "index", "given_label", "given_name", "predicted_label", "predicted_name")
COLUMNS += ("bin", "bin_prob", "score")
"""The keys of ``Report.rows``, in the order a table shows them."""

DIRECTIONS = {1: "higher is more confident", -1: "lower is more confident", 0: "no trend"}
"""``ConfidentErrors.direction`` in words."""


class ConfidentErrors(NamedTuple):
  """Wrong examples of the most confident bins, most confident first.

  Attributes:
    index: [M] int64, example indices into ``u``.
    prob, bin: [M] float32 and int32, each example's bin probability and bin.
    selected_bins: [B] int32, the bins searched, most confident first.
    direction: +1 when higher scores are more confident, -1 when lower scores
      are, 0 when the bins show no trend (then only probability and index order).
  """

  index: np.ndarray
  prob: np.ndarray
  bin: np.ndarray
  selected_bins: np.ndarray
  direction: int
  bins: binning.Bins


def confidence_direction(prob: ArrayLike) -> int:
  """+1, -1 or 0 (also for B < 2): the sign of Spearman's correlation of the bins'
  probabilities ``prob`` [B] (in ascending score order) with their position, exact."""
  prob = validation.float_array("prob", prob, 1, host=True)
  num = prob.shape[0]
  if num < 2:
    return 0
  # Twice the 1-based ranks, ties at their mean rank (first + last): exact integers.
  _, inverse, counts = np.unique(prob, return_inverse=True, return_counts=True)
  last = np.cumsum(counts)
  rank = (last - counts + 1 + last)[inverse.reshape(-1)].astype(np.int64) - (num + 1)
  position = 2 * np.arange(1, num + 1, dtype=np.int64) - (num + 1)
  return int(np.sign(np.sum(position * rank)))


def confident_errors(
  u: ArrayLike,
  correct: ArrayLike,
  *,
  n_bins: int = 20,
  top_bins: int = 1,
  calibration: ArrayLike | None = None,
) -> ConfidentErrors:
  """The wrong examples in the ``top_bins`` bins of highest predicted P(correct), ordered by
  bin probability, then by score from the confident end, then by index.

  ``u`` [N] may be a confidence (pmax) or an uncertainty (-log pmax); ``correct`` is [N]
  bool. ``calibration``: None (all), or an [N] bool mask of the examples the bins are
  fitted on; wrong examples are collected from all N.
  """
  u = validation.float_array("u", u, 1, host=True)
  correct = validation.bool_array("correct", correct, host=True)
  num = validation.same_length(u=u, correct=correct)
  validation.check_nonempty("u", u)
  if calibration is None:
    calibration = np.ones(num, bool)
  else:
    calibration = validation.bool_array("calibration", calibration, host=True)
    validation.same_length(u=u, calibration=calibration)
    if not calibration.any():
      raise ValueError("calibration: expected at least one True entry, got none")
  num_calibration = int(calibration.sum())
  n_bins = validation.positive_int("n_bins", n_bins, maximum=num_calibration)
  top_bins = validation.positive_int("top_bins", top_bins, maximum=n_bins)

  u_device = jnp.asarray(u, jnp.float32)
  bins = binning.fit(u_device[calibration], correct[calibration], n_bins=n_bins)
  example_bin = np.asarray(binning.assign(bins.edges, u_device))
  prob, counts, hits = np.asarray(bins.prob), np.asarray(bins.counts), np.asarray(bins.hits)
  # The bins' dense ranks by their probability as exact fractions: rounding makes no ties.
  prior = fractions.Fraction(int(correct[calibration].sum()), num_calibration)
  exact = [
    binning.calibrated_prob(fractions.Fraction(int(h)), int(c), prior)
    for h, c in zip(hits, counts, strict=True)
  ]
  levels = {value: rank for rank, value in enumerate(sorted(set(exact)))}
  level = np.array([levels[value] for value in exact], np.int64)
  filled = np.flatnonzero(counts > 0)
  direction = confidence_direction(level[filled])
  order = np.lexsort((-direction * filled, -level[filled]))
  selected = filled[order[:top_bins]].astype(np.int32)

  wrong = np.flatnonzero(np.isin(example_bin, selected) & ~correct)
  score = np.asarray(u_device, np.float64)[wrong]
  order = np.lexsort((wrong, -direction * score, -level[example_bin[wrong]]))
  index = wrong[order].astype(np.int64)
  in_bin = example_bin[index]
  return ConfidentErrors(index, prob[in_bin].astype(np.float32), in_bin, selected, direction, bins)


class Report(NamedTuple):
  """The confident errors as table rows, and the bins they were searched in.

  Attributes:
    rows: one dict per confident error, most confident first, keyed by ``COLUMNS``;
      ``bin_prob`` and ``score`` are text, so a CSV shows the float32 values rather than
      their float64 expansions.
    searched_bins: one dict per searched bin, most confident first: ``bin``, ``count``,
      ``correct``, ``prob``, ``score_min`` and ``score_max``.
  """

  rows: list[dict[str, Any]]
  searched_bins: list[dict[str, Any]]
  errors: ConfidentErrors
  num_examples: int
  accuracy: float

  def summary(self) -> dict[str, Any]:
    """JSON-ready totals: num_examples, accuracy, direction (words), searched_bins, num_found."""
    return {
      "num_examples": self.num_examples,
      "accuracy": self.accuracy,
      "direction": DIRECTIONS[self.errors.direction],
      "searched_bins": self.searched_bins,
      "num_found": len(self.rows),
    }


def report(
  u: ArrayLike,
  correct: ArrayLike,
  predicted: ArrayLike,
  given: ArrayLike,
  class_names: Sequence[str],
  *,
  n_bins: int = 20,
  top_bins: int = 1,
) -> Report:
  """``confident_errors`` of all N examples, as rows a person can read.

  ``predicted`` [N] are the model's Top-1 classes and ``given`` [N] the dataset's labels,
  each in [0, K); ``class_names`` has K names.
  """
  u = validation.float_array("u", u, 1, host=True).astype(np.float32)
  num_classes = len(class_names)
  predicted = validation.labels_array("predicted", predicted, num_classes, host=True)
  given = validation.labels_array("given", given, num_classes, host=True)
  validation.same_length(u=u, predicted=predicted, given=given)
  errors = confident_errors(u, correct, n_bins=n_bins, top_bins=top_bins)
  correct = validation.bool_array("correct", correct, host=True)

  rows = [
    {
      "rank": rank,
      "index": int(i),
      "given_label": int(given[i]),
      "given_name": class_names[given[i]],
      "predicted_label": int(predicted[i]),
      "predicted_name": class_names[predicted[i]],
      "bin": int(b),
      "bin_prob": f"{p:.6f}",
      "score": f"{u[i]:.9g}",
    }
    for rank, (i, b, p) in enumerate(zip(errors.index, errors.bin, errors.prob, strict=True), 1)
  ]
  example_bin = np.asarray(binning.assign(errors.bins.edges, jnp.asarray(u)))
  bins = errors.bins
  counts, hits, prob = np.asarray(bins.counts), np.asarray(bins.hits), np.asarray(bins.prob)
  searched = []
  for b in errors.selected_bins.tolist():
    in_bin = u[example_bin == b]  # never empty: only bins holding examples are searched
    stats = {"bin": b, "count": int(counts[b]), "correct": int(hits[b]), "prob": float(prob[b])}
    searched.append(stats | {"score_min": float(in_bin.min()), "score_max": float(in_bin.max())})
  return Report(rows, searched, errors, int(u.shape[0]), float(np.mean(correct)))
