"""The benchmark's comparison methods and metrics (Ovadia et al. 2019; paper Table 1).

Temperature scaling and multiclass histogram binning (Guo et al. 2017), and the multiclass
Brier, NLL and confidence ECE of an [N, K] prediction: probabilities (rows summing to 1), or
logits with ``from_logits=True``. Equal-width bins are right-closed, ``((b-1)/B, b/B]``.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.core.equal_width import (
  DEFAULT_ECE_BINS,
  MAX_EQUAL_WIDTH_BINS,
  EqualWidthBins,
  checked_n_bins,
  count_equal_width,
  equal_width_bins,
  equal_width_edges,
  equal_width_index,
)
from top1_jax.core.metrics import ece as equal_width_ece
from top1_jax.estimators.temperature import apply_temperature as apply_temperature
from top1_jax.estimators.temperature import fit_temperature as fit_temperature

__all__ = [
  "DEFAULT_ECE_BINS",
  "MAX_EQUAL_WIDTH_BINS",
  "EqualWidthBins",
  "HistogramBinning",
  "MulticlassMetrics",
  "apply_temperature",
  "confidence_ece",
  "equal_width_bins",
  "equal_width_ece",
  "equal_width_edges",
  "equal_width_index",
  "fit_histogram_binning",
  "fit_temperature",
  "multiclass_brier",
  "multiclass_metrics",
  "multiclass_nll",
  "predict_histogram_binning",
]


def _checked_pred(given: ArrayLike, from_logits: bool) -> tuple[jax.Array, str]:
  """[N, K] probabilities, or logits with ``from_logits``; returns (pred, its name)."""
  if not isinstance(from_logits, bool):
    raise ValueError(f"from_logits: expected True or False, got {from_logits!r}")
  if from_logits:
    name, pred = "logits", validation.float_array("logits", given, 2)
  else:
    name, pred = "probs", validation.probability_array("probs", given, 2, sums_to_one=True)
  if pred.shape[-1] < 2:
    raise ValueError(f"{name}: expected at least 2 classes, got shape {pred.shape}")
  if from_logits:  # probabilities run as logits give other numbers, silently
    validation.refuse_probabilities(name, pred, "leave from_logits=False", given=given)
  return pred, name


def _prediction(pred: ArrayLike, labels: ArrayLike, from_logits: bool) -> tuple[jax.Array, ...]:
  pred, name = _checked_pred(pred, from_logits)
  validation.check_nonempty(name, pred)
  labels = validation.labels_array("labels", labels, pred.shape[-1])
  validation.same_length(**{name: pred, "labels": labels})
  return pred, labels


def _probs(pred: jax.Array, from_logits: bool) -> jax.Array:
  return jax.nn.softmax(pred, axis=-1) if from_logits else pred


def _confidence_and_correct(pred, labels, from_logits):
  # argmax of the input itself: a saturated float32 softmax could tie distinct logits
  correct = jnp.argmax(pred, axis=-1) == labels
  return jnp.max(_probs(pred, from_logits), axis=-1), correct


class MulticlassMetrics(NamedTuple):
  """The benchmark's metrics of one [N, K] prediction: accuracy, ``multiclass_brier``,
  ``multiclass_nll`` (nats) and ``confidence_ece``, as floats."""

  accuracy: float
  brier: float
  nll: float
  ece: float


@functools.partial(jax.jit, static_argnames=("from_logits",))
def _brier(pred, labels, from_logits):
  probs = _probs(pred, from_logits)
  onehot = jax.nn.one_hot(labels, probs.shape[-1], dtype=probs.dtype)
  # The squared differences, not 1 - 2 p_y + sum p^2: no cancellation near the one-hot label
  return jnp.mean(jnp.sum((probs - onehot) ** 2, axis=-1))


@functools.partial(jax.jit, static_argnames=("from_logits",))
def _nll(pred, labels, from_logits):
  if from_logits:
    log_probs = jax.nn.log_softmax(pred, axis=-1)
  else:  # only exact zeros clipped (float32 softmax underflow): -log(tiny) ~ 87.3 nats, not inf
    log_probs = jnp.log(jnp.maximum(pred, jnp.finfo(pred.dtype).tiny))
  return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=-1))


@functools.partial(jax.jit, static_argnames=("from_logits", "n_bins"))
def _confidence_ece(pred, labels, from_logits, n_bins):
  confidence, correct = _confidence_and_correct(pred, labels, from_logits)
  return count_equal_width(confidence, correct, n_bins).ece


@functools.partial(jax.jit, static_argnames=("from_logits", "n_bins"))
def _multiclass_metrics(pred, labels, from_logits, n_bins):
  _, correct = _confidence_and_correct(pred, labels, from_logits)
  return MulticlassMetrics(
    accuracy=jnp.mean(correct.astype(jnp.float32)),
    brier=_brier(pred, labels, from_logits),
    nll=_nll(pred, labels, from_logits),
    ece=_confidence_ece(pred, labels, from_logits, n_bins),
  )


def multiclass_brier(pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False) -> float:
  """Multiclass Brier score ``mean_n sum_k (p_nk - y_nk)^2`` (one-hot y), in [0, 2].

  The benchmark's code reports this - 1, its paper this / K. Not the binary Top-1 Brier
  ``metrics.brier(pmax, correct)``.
  """
  pred, labels = _prediction(pred, labels, from_logits)
  return float(_brier(pred, labels, from_logits))


def multiclass_nll(pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False) -> float:
  """Multiclass negative log-likelihood ``mean_n -log p_n,y_n`` in nats.

  From probabilities an exact zero on the true class is clipped to the smallest normal
  float (float32: 87.3 nats instead of inf); logits avoid this.
  """
  pred, labels = _prediction(pred, labels, from_logits)
  return float(_nll(pred, labels, from_logits))


def confidence_ece(
  pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False, n_bins: int = DEFAULT_ECE_BINS
) -> float:
  """Confidence ECE (Guo et al. 2017; the benchmark's ``expected_calibration_error_multiclass``).

  ``sum_b (n_b / N) |acc_b - conf_b|`` over ``n_bins`` equal-width bins of pmax (15 in the
  benchmark): the Top-1 ECE ``metrics.ece(pmax, argmax p == y, n_bins)``.
  """
  pred, labels = _prediction(pred, labels, from_logits)
  return float(_confidence_ece(pred, labels, from_logits, checked_n_bins(n_bins)))


def multiclass_metrics(
  pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False, n_bins: int = DEFAULT_ECE_BINS
) -> MulticlassMetrics:
  """Accuracy, multiclass Brier, NLL and confidence ECE in one jitted call (each equal to
  its single-metric function)."""
  pred, labels = _prediction(pred, labels, from_logits)
  values = _multiclass_metrics(pred, labels, from_logits, checked_n_bins(n_bins))
  return MulticlassMetrics(*(float(value) for value in values))


class HistogramBinning(NamedTuple):
  """Fitted one-vs-rest equal-width histogram binning (a pytree).

  Attributes:
    value: [K, B] float, the calibrated probability of class k for a class-k
      probability in bin b (the bin's midpoint when the bin is empty).
    counts: [K, B] int32, calibration examples whose class-k probability is in bin b.
    hits: [K, B] int32, of those, the ones labelled k.
  """

  value: jax.Array
  counts: jax.Array
  hits: jax.Array

  @property
  def n_bins(self) -> int:
    return self.counts.shape[-1]

  @property
  def num_classes(self) -> int:
    return self.counts.shape[0]


@functools.partial(jax.jit, static_argnames=("n_bins",))
def _fit_histogram_binning(probs, labels, n_bins) -> HistogramBinning:
  num_classes = probs.shape[-1]
  index = equal_width_index(probs, n_bins)  # [N, K]
  # One segment per (class, bin): all K one-vs-rest histograms in one segment_sum.
  segment = (jnp.arange(num_classes, dtype=jnp.int32) * n_bins + index).reshape(-1)
  is_label = (labels[:, None] == jnp.arange(num_classes)).reshape(-1)
  counts = jax.ops.segment_sum(jnp.ones_like(segment), segment, num_classes * n_bins)
  hits = jax.ops.segment_sum(is_label.astype(jnp.int32), segment, num_classes * n_bins)
  counts, hits = (x.reshape(num_classes, n_bins) for x in (counts, hits))
  midpoint = (jnp.arange(n_bins, dtype=probs.dtype) + 0.5) / n_bins
  value = jnp.where(counts > 0, hits / jnp.maximum(counts, 1), midpoint)
  return HistogramBinning(value.astype(probs.dtype), counts, hits)


@jax.jit
def _predict_histogram_binning(binning: HistogramBinning, probs):
  index = equal_width_index(probs, binning.n_bins)
  calibrated = jnp.take_along_axis(binning.value.T, index, axis=0)  # value[k, index[n, k]]
  total = jnp.sum(calibrated, axis=-1, keepdims=True)
  return jnp.where(total > 0, calibrated / jnp.where(total > 0, total, 1.0), probs)


def fit_histogram_binning(
  pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False, n_bins: int = DEFAULT_ECE_BINS
) -> HistogramBinning:
  """Fits multiclass histogram binning (Guo et al. 2017) on a calibration split.

  Per class k (one-vs-rest), each equal-width bin of p_k gets the fraction of its
  calibration examples labelled k. An empty bin keeps its midpoint ``(b + 1/2) / B``, not
  0, which would veto class k for its test examples.
  """
  pred, labels = _prediction(pred, labels, from_logits)
  n_bins = checked_n_bins(n_bins)
  return _fit_histogram_binning(_probs(pred, from_logits), labels, n_bins)


def predict_histogram_binning(
  binning: HistogramBinning, pred: ArrayLike, *, from_logits: bool = False
) -> jax.Array:
  """[N, K] calibrated class probabilities: each replaced by its bin's value, each row
  renormalised (a row of all zeros keeps the input probabilities). The argmax can change.
  """
  validation.instance("binning", binning, HistogramBinning, "fit_histogram_binning's result")
  pred, name = _checked_pred(pred, from_logits)
  pred = _probs(pred, from_logits)
  if pred.shape[-1] != binning.num_classes:
    raise ValueError(
      f"{name}: expected {binning.num_classes} classes like the fitted binning,"
      f" got shape {pred.shape}"
    )
  return _predict_histogram_binning(binning, pred)
