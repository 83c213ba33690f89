"""Top-label histogram binning: equal-count bins of the confidence per predicted class.

A baseline for the paper's single set of bins, after Gupta & Ramdas, "Top-label
calibration and multiclass-to-binary reductions" (ICLR 2022): the top-label
confidence is binned separately for each predicted class, so P(correct) may
depend on the class as well as on the confidence. Each class's bins are
``binning.fit`` on that class's calibration examples (same quantile edges,
right-closed bins and one-pseudo-count prior, here at the class's accuracy).

``ESTIMATOR`` (its entry in ``registry.REGISTRY``) takes the confidence and the
predicted class from the model's log-probabilities: the log of the top-k mass (log
pmax for Top-1; its order is pmax's, without pmax's ties at 1.0 in float32) and the
arg max.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, scores, validation
from top1_jax.estimators import base, bins
from top1_jax.kernels import compile_policy


class TopLabelBins(NamedTuple):
  """Bins per predicted class (a pytree of jax arrays).

  Attributes:
    per_class: ``binning.Bins`` whose fields have a leading [num_classes] axis:
      class k's own bins, or a copy of ``pooled`` when ``own[k]`` is False.
    own: [num_classes] bool, whether class k had enough examples for its own bins.
    pooled: ``binning.Bins`` fitted on every class together.

  ``fit_splits`` gives every field a leading [F] axis, one entry per split.
  """

  per_class: binning.Bins
  own: jax.Array
  pooled: binning.Bins

  @property
  def num_classes(self) -> int:
    return self.own.shape[-1]


def _classes(predicted_class: ArrayLike, num_classes: int | None) -> tuple[np.ndarray, int]:
  """Host int32 class ids and the number of classes (max + 1 when not given)."""
  if num_classes is None:
    ids = validation.labels_array(
      "predicted_class", predicted_class, np.iinfo(np.int32).max, host=True
    )
    num_classes = int(np.max(ids)) + 1 if ids.shape[0] else 1
  num_classes = validation.positive_int("num_classes", num_classes)
  return validation.labels_array("predicted_class", predicted_class, num_classes, host=True), (
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
  return TopLabelBins(_where_own_jit(own, grouped, pooled), jax.device_put(own), pooled)


def _where_own(own, per_class: binning.Bins, pooled: binning.Bins) -> binning.Bins:
  """Each class's own bins where it has them, else the pooled ones (every field at once)."""
  pick = lambda mine, all_: jnp.where(own.reshape(-1, *[1] * all_.ndim), mine, all_)  # noqa: E731
  return jax.tree.map(pick, per_class, pooled)


_where_own_jit = compile_policy.jit_small(_where_own)


def fit_splits(
  confidence: ArrayLike,
  predicted_class: ArrayLike,
  correct: ArrayLike,
  calibration: ArrayLike,
  n_bins: int = 15,
  *,
  num_classes: int,
  min_per_bin: int = 10,
) -> TopLabelBins:
  """``fit`` on each split's calibration part, every split at once.

  Split f's bins equal ``fit(confidence[c], predicted_class[c], correct[c], ...)``
  for c = ``calibration[f]``, bit for bit: the edges from one sort of all examples
  (``binning.split_group_edges``), then one compiled program counts every split's
  per-class and pooled bins (a loop of ``fit`` costs ~10 programs and a few sorts
  per split).

  Args:
    confidence, predicted_class, correct: as for ``fit``, [N] each.
    calibration: [F, N] bool, each split's calibration examples (at least
      ``n_bins`` in every split).
    n_bins, num_classes, min_per_bin: as for ``fit``.

  Returns:
    ``TopLabelBins`` whose fields have a leading [F] axis (``predict`` takes it).
  """
  confidence, correct = validation.score_and_event("confidence", confidence, correct, host=True)
  classes, num_classes = _classes(predicted_class, num_classes)
  validation.same_length(confidence=confidence, predicted_class=classes)
  calibration = np.asarray(validation.bool_array("calibration", calibration, 2, host=True))
  if calibration.shape[-1] != confidence.shape[0]:
    raise ValueError(
      f"calibration: expected [F, {confidence.shape[0]}] (one row per split), "
      f"got shape {calibration.shape}"
    )
  smallest = int(calibration.sum(axis=1).min()) if calibration.shape[0] else 0
  n_bins = validation.positive_int("n_bins", n_bins, maximum=smallest)
  min_per_bin = validation.positive_int("min_per_bin", min_per_bin)
  u = validation.in_device_dtype(confidence)
  per_class = binning.split_group_edges(u, classes, calibration, n_bins, num_classes)
  pooled = binning.split_group_edges(u, np.zeros_like(classes), calibration, n_bins, 1)
  sizes = np.stack([np.bincount(classes[cal], minlength=num_classes) for cal in calibration])
  own = sizes >= min_per_bin * n_bins
  # Padded to a size bucket with weight 0: one program for every N of a bucket.
  size = binning.bucket_size(u.shape[0])
  examples = [np.pad(x, (0, size - u.shape[0])) for x in (u, classes, correct)]
  weight = np.pad(calibration, ((0, 0), (0, size - u.shape[0]))).astype(np.int32)
  return _fit_splits(own, per_class, pooled, *examples, weight)


@jax.jit  # per-example work over [F, N]: at backend level 0 it ran 115 ms, here 40 ms
def _fit_splits(own, per_class_edges, pooled_edges, u, classes, correct, weight) -> TopLabelBins:
  def one_split(own, per_class_edges, pooled_edges, weight):
    per_class = binning.counted_groups(per_class_edges, u, classes, correct, weight, own.shape[0])
    pooled = binning.counted_groups(pooled_edges, u, jnp.zeros_like(classes), correct, weight, 1)
    pooled = jax.tree.map(lambda field: field[0], pooled)
    return TopLabelBins(_where_own(own, per_class, pooled), own, pooled)

  return jax.vmap(one_split)(own, per_class_edges, pooled_edges, weight)


def _probability(per_class: binning.Bins, confidence: jax.Array, classes: jax.Array) -> jax.Array:
  which = jax.vmap(binning.assign)(per_class.edges[classes], confidence)
  return per_class.prob[classes, which]


_predict = jax.jit(_probability)
_predict_splits = jax.jit(jax.vmap(_probability, (0, None, None)))


def predict(model: TopLabelBins, confidence: ArrayLike, predicted_class: ArrayLike) -> jax.Array:
  """Calibrated P(correct): the probability of each example's bin in its class's bins.

  Args:
    model: from ``fit``, or from ``fit_splits`` (each split's bins on every example).
    confidence: [N] float, the top-label confidence.
    predicted_class: [N] int in [0, model.num_classes).

  Returns:
    [N] float in (0, 1); [F, N] for a model of ``fit_splits``.
  """
  validation.instance("model", model, TopLabelBins, "toplabel.TopLabelBins from toplabel.fit")
  confidence = validation.float_array("confidence", confidence, 1)
  classes = validation.labels_array("predicted_class", predicted_class, model.num_classes)
  validation.same_length(confidence=confidence, predicted_class=classes)
  program = _predict_splits if model.own.ndim == 2 else _predict
  num = confidence.shape[0]
  if validation.is_traced(confidence) or validation.is_traced(classes):
    return program(model.per_class, confidence, classes)
  # Padded to a size bucket: one compiled program for every split's test size.
  size = binning.bucket_size(num)
  padded = [np.pad(np.asarray(x), (0, size - num)) for x in (confidence, classes)]
  return jax.device_put(np.asarray(program(model.per_class, *padded))[..., :num])  # host slice


def to_dict(model: TopLabelBins) -> dict:
  """The fitted model as JSON values: each class's bins, which are its own, the pooled."""
  host = jax.tree.map(np.asarray, model.per_class)  # one copy, then sliced on the host
  per_class = [
    bins.to_dict(jax.tree.map(lambda field, c=c: field[c], host)) for c in range(model.num_classes)
  ]
  own = np.asarray(model.own).tolist()
  return {"per_class": per_class, "own": own, "pooled": bins.to_dict(model.pooled)}


def from_dict(d, source: str) -> TopLabelBins:
  """``TopLabelBins`` from ``to_dict``'s values, each checked (one-line ValueError)."""
  listed = base.field(d, "per_class", source)
  own = base.field(d, "own", source)
  if not isinstance(listed, list) or not listed:
    raise ValueError(f"{source}: field 'per_class' must be a list of bins, one per class")
  if not isinstance(own, list) or len(own) != len(listed) or {*map(type, own)} - {bool}:
    raise ValueError(f"{source}: field 'own' must be {len(listed)} booleans, one per class")
  pooled = bins.from_dict(base.field(d, "pooled", source), f"{source} (pooled)")
  per_class = [bins.host_from_dict(b, f"{source} (class {c})") for c, b in enumerate(listed)]
  if any(b.n_bins != pooled.n_bins for b in per_class):
    raise ValueError(f"{source}: every class must have the pooled bins' {pooled.n_bins} bins")
  stacked = jax.tree.map(lambda *fields: np.stack(fields), *per_class)
  return TopLabelBins(jax.device_put(stacked), jax.device_put(np.asarray(own)), pooled)


def _confidence_and_class(evidence: base.Evidence) -> tuple[np.ndarray, np.ndarray]:
  log_probs = evidence.log_probs
  confidence = -np.asarray(scores.compute_one(scores.topk_name(evidence.k), log_probs))
  return confidence, np.asarray(np.argmax(log_probs, axis=-1))


def _fit_evidence(evidence: base.Evidence, *, n_bins: int = 15, min_per_bin: int = 10):
  confidence, classes = _confidence_and_class(evidence)
  num_classes = int(evidence.log_probs.shape[-1])
  return fit(
    confidence, classes, evidence.correct, n_bins, num_classes=num_classes, min_per_bin=min_per_bin
  )


def _predict_evidence(model: TopLabelBins, evidence: base.Evidence) -> jax.Array:
  return predict(model, *_confidence_and_class(evidence))


ESTIMATOR = base.Estimator(
  name="toplabel",
  needs="log_probs",
  fit=_fit_evidence,
  predict=_predict_evidence,
  to_dict=to_dict,
  from_dict=from_dict,
  options=("n_bins", "min_per_bin"),
)
"""Equal-count bins of the top-k mass per predicted class (Gupta & Ramdas 2022)."""
