"""Top-label histogram binning: equal-count bins of the confidence per predicted class.

A baseline for the paper's single set of bins, after Gupta & Ramdas, "Top-label
calibration and multiclass-to-binary reductions" (ICLR 2022): the top-label
confidence is binned separately for each predicted class, so P(correct) may
depend on the class as well as on the confidence. Each class's bins are
``binning.fit`` on that class's calibration examples (same quantile edges,
right-closed bins and one-pseudo-count prior, here at the class's accuracy).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax import binning, jitting, validation


class TopLabelBins(NamedTuple):
  """Bins per predicted class (a pytree of jax arrays).

  Attributes:
    per_class: ``binning.Bins`` whose fields have a leading [num_classes] axis:
      class k's own bins, or a copy of ``pooled`` when ``own[k]`` is False.
    own: [num_classes] bool, whether class k had enough examples for its own bins.
    pooled: ``binning.Bins`` fitted on every class together.
  """

  per_class: binning.Bins
  own: jax.Array
  pooled: binning.Bins

  @property
  def num_classes(self) -> int:
    return self.own.shape[0]


def _classes(predicted_class: ArrayLike, num_classes: int | None) -> tuple[np.ndarray, int]:
  """Host int32 class ids and the number of classes (max + 1 when not given)."""
  if num_classes is None:
    ids = validation.labels_array("predicted_class", predicted_class, np.iinfo(np.int32).max)
    num_classes = int(jnp.max(ids)) + 1 if ids.shape[0] else 1
  num_classes = validation.positive_int("num_classes", num_classes)
  return np.asarray(validation.labels_array("predicted_class", predicted_class, num_classes)), (
    num_classes
  )


def fit(
  confidence: ArrayLike,
  predicted_class: ArrayLike,
  correct: ArrayLike,
  n_bins: int = 15,
  *,
  num_classes: int | None = None,
  min_per_bin: int = 10,
) -> TopLabelBins:
  """Fits equal-count bins of the top-label confidence for each predicted class.

  A class with at least ``min_per_bin * n_bins`` calibration examples gets
  ``binning.fit(confidence[c], correct[c], n_bins)`` on its own examples c;
  a class with fewer (or none) falls back to the pooled bins, fitted on all
  examples, as too few points per bin would make its probabilities mostly noise.

  Args:
    confidence: [N] float, the top-label confidence (e.g. the max softmax); any
      score works, as only its order matters.
    predicted_class: [N] int in [0, num_classes), the predicted (top) class.
    correct: [N] bool, whether the prediction is correct.
    n_bins: bins per class, 1 <= n_bins <= N.
    num_classes: the number of classes (default: max(predicted_class) + 1).
    min_per_bin: the fewest examples per bin a class needs for its own bins.

  Returns:
    ``TopLabelBins``.
  """
  confidence, correct = validation.score_and_event("confidence", confidence, correct, host=True)
  classes, num_classes = _classes(predicted_class, num_classes)
  validation.same_length(confidence=confidence, predicted_class=classes)
  n_bins = validation.positive_int("n_bins", n_bins, maximum=confidence.shape[0])
  min_per_bin = validation.positive_int("min_per_bin", min_per_bin)
  pooled = binning.fit(confidence, correct, n_bins)
  own = np.bincount(classes, minlength=num_classes) >= min_per_bin * n_bins
  # Every class's bins at once: one sort and one compiled count, not one fit per class.
  grouped = binning.fit_groups(confidence, classes, correct, n_bins, num_classes)
  return TopLabelBins(_where_own(own, grouped, pooled), jax.device_put(own), pooled)


@jitting.jit_small
def _where_own(own, per_class: binning.Bins, pooled: binning.Bins) -> binning.Bins:
  """Each class's own bins where it has them, else the pooled ones (every field at once)."""
  pick = lambda mine, all_: jnp.where(own.reshape(-1, *[1] * all_.ndim), mine, all_)  # noqa: E731
  return jax.tree.map(pick, per_class, pooled)


@jax.jit
def _predict(per_class: binning.Bins, confidence: jax.Array, classes: jax.Array) -> jax.Array:
  which = jax.vmap(binning.assign)(per_class.edges[classes], confidence)
  return per_class.prob[classes, which]


def predict(model: TopLabelBins, confidence: ArrayLike, predicted_class: ArrayLike) -> jax.Array:
  """Calibrated P(correct): the probability of each example's bin in its class's bins.

  Args:
    model: from ``fit``.
    confidence: [N] float, the top-label confidence.
    predicted_class: [N] int in [0, model.num_classes).

  Returns:
    [N] float in (0, 1).
  """
  validation.instance("model", model, TopLabelBins, "toplabel.TopLabelBins from toplabel.fit")
  confidence = validation.float_array("confidence", confidence, 1)
  classes = validation.labels_array("predicted_class", predicted_class, model.num_classes)
  validation.same_length(confidence=confidence, predicted_class=classes)
  num = confidence.shape[0]
  if validation.is_traced(confidence) or validation.is_traced(classes):
    return _predict(model.per_class, confidence, classes)
  # Padded to a size bucket: one compiled program for every split's test size.
  size = binning.bucket_size(num)
  padded = [np.pad(np.asarray(x), (0, size - num)) for x in (confidence, classes)]
  return jax.device_put(np.asarray(_predict(model.per_class, *padded))[:num])  # host slice
