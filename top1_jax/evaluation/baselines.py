"""Benchmark implementations to compare Top-1 binning against (paper Table 1).

The comparison methods and metrics of Ovadia, Snoek et al. 2019 ("Can you trust
your model's uncertainty?"), defined as that benchmark defines them:

* **Temperature scaling** (Guo et al. 2017): one scalar T > 0 fitted on the
  calibration split by minimising the multiclass NLL of softmax(logits / T).
* **Multiclass histogram binning** (Guo et al. 2017, one-vs-rest after Zadrozny &
  Elkan 2002): equal-width bins of each class probability, bin value = how often
  that class is the label in the bin, then renormalised across classes.
* **Multiclass metrics** of a full probability vector: Brier
  ``sum_k (p_k - y_k)^2``, NLL ``-log p_y`` and the confidence ECE with
  equal-width bins over the max probability.

Conventions shared by the functions here:

* Predictions come first, then labels, as in every public metric of the library
  (``metrics.brier(p, correct)``): ``pred`` is [N, K] probabilities (rows summing
  to 1), or logits with ``from_logits=True``. Logits whose every row lies in [0, 1]
  and sums to 1 are refused (probabilities: leave ``from_logits`` False), and
  probabilities out of [0, 1] or not summing to 1 too (logits: pass
  ``from_logits=True``). ``fit_temperature`` and ``apply_temperature`` (defined in
  ``temperature``, re-exported here) take logits only.
* Metrics return Python floats (``MulticlassMetrics`` of floats), as ``metrics``' do.
* The predicted class is the first argmax (as ``events.topk_correct``).
* Equal-width bins are right-closed, ``((b-1)/B, b/B]``, with 0 in the first
  bin (Guo et al.'s ``I_m``; the benchmark's ``np.digitize(..., right=True)``); they
  are ``core.equal_width``'s, their ECE ``metrics.ece`` (re-exported here as
  ``equal_width_ece``).

**Brier convention.** ``multiclass_brier`` is ``mean_n sum_k (p_nk - y_nk)^2``,
in [0, 2] (0 for a confident correct one-hot prediction; 1 - 1/K for uniform).
The benchmark numbers quoted in the paper's Table 1 (Vanilla: 0.18 on CIFAR-10,
0.34 on ImageNet) fit this scale: on the code's scale below they would be
negative at those accuracies, on the 1/K scale about K times smaller.
Conversions:

* the benchmark's code (``metrics_lib.brier_scores``) returns
  ``sum_k p_k^2 - 2 p_y`` = this - 1, in [-1, 1];
* the benchmark paper's formula carries a factor 1/|Y|, and a mean over all
  N x K entries (``np.mean((p - onehot)**2)``) is the same: this / K, so
  multiply those by K to get this.

**Not the Top-1 Brier.** Writing c = 1[argmax p = y],
``sum_k (p_k - y_k)^2 = (p_max - c)^2 + sum_{k != argmax} (p_k - y_k)^2``: the
multiclass Brier is the binary Top-1 Brier of ``p_max`` used as P(correct)
(``metrics.brier(pmax, correct)``) *plus* a non-negative term for how the rest of
the mass is spread. Compare Top-1 binning with the latter, not the former.
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


# ----------------------------------------------------------------------------- inputs


def _checked_pred(given: ArrayLike, from_logits: bool) -> tuple[jax.Array, str]:
  """[N, K] probabilities, or logits with ``from_logits``; returns (pred, its name)."""
  if not isinstance(from_logits, bool):
    raise ValueError(f"from_logits: expected True or False, got {from_logits!r}")
  name = "logits" if from_logits else "probs"
  if from_logits:
    pred = validation.float_array(name, given, 2)
  else:
    pred = validation.probability_array(name, given, 2, sums_to_one=True)
  if pred.shape[-1] < 2:
    raise ValueError(f"{name}: expected at least 2 classes, got shape {pred.shape}")
  if from_logits:  # probabilities run as logits give other numbers, silently
    validation.refuse_probabilities(name, pred, "leave from_logits=False", given=given)
  return pred, name


def _prediction(
  pred: ArrayLike, labels: ArrayLike, from_logits: bool
) -> tuple[jax.Array, jax.Array]:
  """Validates ([N, K] predictions, [N] labels); returns them as arrays."""
  pred, name = _checked_pred(pred, from_logits)
  validation.check_nonempty(name, pred)
  labels = validation.labels_array("labels", labels, pred.shape[-1])
  validation.same_length(**{name: pred, "labels": labels})
  return pred, labels


def _log_probs(pred: jax.Array, from_logits: bool) -> jax.Array:
  if from_logits:
    return jax.nn.log_softmax(pred, axis=-1)
  # Only exact zeros are clipped (float32 softmax underflow): -log(tiny) ~ 87.3 nats
  # instead of inf. Pass logits to avoid the underflow altogether.
  return jnp.log(jnp.maximum(pred, jnp.finfo(pred.dtype).tiny))


def _probs(pred: jax.Array, from_logits: bool) -> jax.Array:
  return jax.nn.softmax(pred, axis=-1) if from_logits else pred


def _confidence_and_correct(
  pred: jax.Array, labels: jax.Array, from_logits: bool
) -> tuple[jax.Array, jax.Array]:
  # argmax of the input itself (logits when given): a saturated float32 softmax
  # could tie classes whose logits differ.
  correct = jnp.argmax(pred, axis=-1) == labels
  return jnp.max(_probs(pred, from_logits), axis=-1), correct


# ------------------------------------------------------------------ multiclass metrics


class MulticlassMetrics(NamedTuple):
  """The benchmark's metrics of one [N, K] prediction (see the module docstring).

  Attributes:
    accuracy: Top-1 accuracy.
    brier: mean sum_k (p_k - y_k)^2, in [0, 2].
    nll: mean -log p_y, nats.
    ece: confidence ECE, equal-width bins over max_k p_k.
  """

  accuracy: float
  brier: float
  nll: float
  ece: float


@functools.partial(jax.jit, static_argnames=("from_logits",))
def _brier(pred, labels, from_logits):
  probs = _probs(pred, from_logits)
  onehot = jax.nn.one_hot(labels, probs.shape[-1], dtype=probs.dtype)
  # The squared differences directly, not 1 - 2 p_y + sum p^2: no cancellation
  # when the prediction is close to the one-hot label.
  return jnp.mean(jnp.sum((probs - onehot) ** 2, axis=-1))


@functools.partial(jax.jit, static_argnames=("from_logits",))
def _nll(pred, labels, from_logits):
  log_probs = _log_probs(pred, from_logits)
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
  """Multiclass Brier score ``mean_n sum_k (p_nk - y_nk)^2`` (one-hot y).

  On the [0, 2] scale; the benchmark's code reports this - 1, the 1/|Y| form
  this / K (module docstring). Not comparable with the binary Top-1 Brier
  ``metrics.brier``: it is that of ``pmax`` plus the squared error of the other
  classes' probabilities.

  Args:
    pred: [N, K] float, probabilities (rows summing to 1), or logits with
      ``from_logits`` (probabilities are their softmax).
    labels: [N] int in [0, K).
    from_logits: whether ``pred`` holds logits.

  Returns:
    float in [0, 2] (smaller is better).
  """
  pred, labels = _prediction(pred, labels, from_logits)
  return float(_brier(pred, labels, from_logits))


def multiclass_nll(pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False) -> float:
  """Multiclass negative log-likelihood ``mean_n -log p_n,y_n`` in nats.

  From logits it is ``logsumexp(l) - l_y``, exact for any logit scale. From
  probabilities only an exact zero on the true class is clipped, to the smallest
  normal float (float32: 87.3 nats instead of inf).

  Args:
    pred: [N, K] float, probabilities (rows summing to 1), or logits with
      ``from_logits``.
    labels: [N] int in [0, K).
    from_logits: whether ``pred`` holds logits.

  Returns:
    float >= 0 (smaller is better).
  """
  pred, labels = _prediction(pred, labels, from_logits)
  return float(_nll(pred, labels, from_logits))


def confidence_ece(
  pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False, n_bins: int = DEFAULT_ECE_BINS
) -> float:
  """Confidence ECE (Guo et al. 2017; the benchmark's ``expected_calibration_error_multiclass``).

  ``sum_b (n_b / N) |acc_b - conf_b|`` over B equal-width bins of the max
  probability ``pmax = max_k p_k``, acc_b the Top-1 accuracy and conf_b the mean
  pmax in bin b.

  This already *is* the binary Top-1 ECE of pmax used as P(correct), with
  equal-width bins: ``metrics.ece(pmax, argmax p == y, n_bins)``. There is no
  separate Top-1 version of it; call ``metrics.ece`` for other P(correct)
  predictions.

  Args:
    pred: [N, K] float, probabilities (rows summing to 1), or logits with
      ``from_logits``.
    labels: [N] int in [0, K).
    from_logits: whether ``pred`` holds logits.
    n_bins: 1 <= B <= ``MAX_EQUAL_WIDTH_BINS`` (15 in the benchmark).

  Returns:
    float in [0, 1].
  """
  pred, labels = _prediction(pred, labels, from_logits)
  return float(_confidence_ece(pred, labels, from_logits, checked_n_bins(n_bins)))


def multiclass_metrics(
  pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False, n_bins: int = DEFAULT_ECE_BINS
) -> MulticlassMetrics:
  """Accuracy, multiclass Brier, NLL and confidence ECE in one validated, jitted call.

  Args:
    pred: [N, K] float, probabilities (rows summing to 1), or logits with
      ``from_logits``.
    labels: [N] int in [0, K).
    from_logits: whether ``pred`` holds logits.
    n_bins: equal-width ECE bins, 1 <= B <= ``MAX_EQUAL_WIDTH_BINS``.

  Returns:
    ``MulticlassMetrics`` of floats, each equal to its single-metric function.
  """
  pred, labels = _prediction(pred, labels, from_logits)
  values = _multiclass_metrics(pred, labels, from_logits, checked_n_bins(n_bins))
  return MulticlassMetrics(*(float(value) for value in values))


# ---------------------------------------------------------------- histogram binning


class HistogramBinning(NamedTuple):
  """Fitted one-vs-rest equal-width histogram binning (a pytree).

  Attributes:
    value: [K, B] float, the calibrated probability of class k for a class-k
      probability in bin b: the fraction of calibration examples in that bin
      whose label is k, or the bin's midpoint when the bin is empty.
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
  counts = counts.reshape(num_classes, n_bins)
  hits = hits.reshape(num_classes, n_bins)
  midpoint = (jnp.arange(n_bins, dtype=probs.dtype) + 0.5) / n_bins
  value = jnp.where(counts > 0, hits / jnp.maximum(counts, 1), midpoint)
  return HistogramBinning(value.astype(probs.dtype), counts, hits)


@jax.jit
def _predict_histogram_binning(binning: HistogramBinning, probs):
  n_bins = binning.value.shape[-1]
  index = equal_width_index(probs, n_bins)
  calibrated = jnp.take_along_axis(binning.value.T, index, axis=0)  # value[k, index[n, k]]
  total = jnp.sum(calibrated, axis=-1, keepdims=True)
  return jnp.where(total > 0, calibrated / jnp.where(total > 0, total, 1.0), probs)


def fit_histogram_binning(
  pred: ArrayLike, labels: ArrayLike, *, from_logits: bool = False, n_bins: int = DEFAULT_ECE_BINS
) -> HistogramBinning:
  """Fits multiclass histogram binning (Guo et al. 2017) on a calibration split.

  For each class k independently (one-vs-rest), [0, 1] is cut into B
  equal-width right-closed bins of the class-k probability p_k, and each bin's
  value is the fraction of the calibration examples falling in it whose label
  is k (the squared-loss-optimal constant, Guo et al. §4.1).

  Empty bins: a bin that no calibration example fell into keeps its midpoint
  ``(b + 1/2) / B``, i.e. roughly the model's own probability, rather than 0 (which
  would veto class k for any such test example) or NaN. netcal's
  ``HistogramBinning`` makes the same choice.

  Args:
    pred: [N, K] float, probabilities (rows summing to 1), or logits with
      ``from_logits`` (binned after softmax).
    labels: [N] int in [0, K).
    from_logits: whether ``pred`` holds logits.
    n_bins: 1 <= B <= ``MAX_EQUAL_WIDTH_BINS``.

  Returns:
    ``HistogramBinning`` with values, counts and hits of shape [K, B].
  """
  pred, labels = _prediction(pred, labels, from_logits)
  n_bins = checked_n_bins(n_bins)
  return _fit_histogram_binning(_probs(pred, from_logits), labels, n_bins)


def predict_histogram_binning(
  binning: HistogramBinning, pred: ArrayLike, *, from_logits: bool = False
) -> jax.Array:
  """Calibrated class probabilities from fitted histogram binning.

  Each class probability is replaced by its bin's value, then each row is
  divided by its sum. A row whose K values are all 0 (every class's bin saw
  calibration examples but never that class) has nothing to normalise; it keeps
  the input probabilities unchanged.

  Note the argmax can change (the paper notes histogram binning lost accuracy),
  and many examples share identical rows: score the result with the multiclass
  metrics, which take its own argmax.

  Args:
    binning: from ``fit_histogram_binning``.
    pred: [N, K] float, probabilities (rows summing to 1), or logits with
      ``from_logits``.
    from_logits: whether ``pred`` holds logits.

  Returns:
    [N, K] float, rows summing to 1.
  """
  validation.instance("binning", binning, HistogramBinning, "fit_histogram_binning's result")
  pred, name = _checked_pred(pred, from_logits)
  if from_logits:
    pred = jax.nn.softmax(pred, axis=-1)
  if pred.shape[-1] != binning.num_classes:
    raise ValueError(
      f"{name}: expected {binning.num_classes} classes like the fitted binning,"
      f" got shape {pred.shape}"
    )
  return _predict_histogram_binning(binning, pred)
