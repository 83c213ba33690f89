"""Top-label histogram binning (Gupta & Ramdas 2022): equal-mass bins per predicted class.

As the reference code (ICLR 2022, ``HB_toplabel``) does it: class c, predicted for n_c
calibration examples, gets ``floor(n_c / points_per_bin)`` right-closed bins of its top-label
confidence, cut as ``np.array_split`` cuts its sorted scores; each bin predicts its plain
accuracy (``prior=True``: ``(hits + p_c) / (count + 1)`` at the class's accuracy p_c), an
empty one 0.5; a class without bins gets its confidence back (or ``uncalibrated``).

Unlike the reference, tied scores stay in one bin (no 1e-10 noise) and the arithmetic is
float32. ``ESTIMATOR`` bins the log of the top-k mass, extending it to the Top-k event.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, scores, validation
from top1_jax.estimators import base

DEFAULT_POINTS_PER_BIN = 50
"""The reference's ``HB_toplabel(points_per_bin=50)``."""

EMPTY_BIN_PROB = 0.5
"""What a bin without calibration examples predicts without the prior (the reference's)."""

_MAX_KEYS = 2**31 - 1  # bin lookups use int32 keys of (class, rank among all edges)


class TopLabelBins(NamedTuple):
  """Bins per predicted class (a pytree of jax arrays).

  Attributes:
    per_class: ``binning.Bins`` whose fields have a leading [C] axis, padded to B slots
      (B - 1 a power of two, at least the most bins any class has, less one): edges
      [C, B - 1] (+inf padded), counts, hits and prob [C, B], prior [C] (the class's
      calibration accuracy, NaN for a class never predicted) and num_effective_bins [C].
      A class without bins has its calibration examples counted in its first bin, unused.
    num_bins: [C] int32, floor(n_c / points_per_bin): class c's own bins (0: none).
    with_prior: [] bool, whether ``prob`` carries the one-pseudo-count prior.

  ``fit_splits`` gives every field a leading [F] axis, one entry per split.
  """

  per_class: binning.Bins
  num_bins: jax.Array
  with_prior: jax.Array

  @property
  def num_classes(self) -> int:
    return self.num_bins.shape[-1]

  @property
  def own(self) -> jax.Array:
    """[C] (or [F, C]) bool: whether class c has bins of its own."""
    return self.num_bins > 0


def _classes(predicted_class: ArrayLike, num_classes: int | None) -> tuple[np.ndarray, int]:
  """Host int32 class ids and the number of classes (max + 1 when not given)."""
  labels = functools.partial(validation.labels_array, "predicted_class", predicted_class, host=True)
  if num_classes is None:
    ids = labels(np.iinfo(np.int32).max)
    num_classes = int(np.max(ids)) + 1 if ids.shape[0] else 1
  num_classes = validation.positive_int("num_classes", num_classes)
  return labels(num_classes), num_classes


def fit(
  confidence: ArrayLike,
  predicted_class: ArrayLike,
  correct: ArrayLike,
  *,
  points_per_bin: int = DEFAULT_POINTS_PER_BIN,
  prior: bool = False,
  num_classes: int | None = None,
) -> TopLabelBins:
  """Fits ``floor(n_c / points_per_bin)`` equal-mass bins of the confidence per class.

  Args:
    confidence: [N] float, the top-label confidence (the max softmax in the reference).
    predicted_class: [N] int in [0, num_classes), the predicted (top) class.
    correct: [N] bool, whether the prediction is correct.
    points_per_bin: calibration examples per bin (the fewest a class needs for one).
    prior: False (default, the reference): each bin predicts its plain accuracy;
      True: ``(hits + p_c) / (count + 1)`` at the class's accuracy p_c.
    num_classes: the number of classes (default: max(predicted_class) + 1).
  """
  num = validation.float_array("confidence", confidence, 1, host=True).shape[0]
  model = fit_splits(
    confidence, predicted_class, correct, np.ones((1, num), bool),
    points_per_bin=points_per_bin, prior=prior, num_classes=num_classes,
  )  # fmt: skip
  return jax.tree.map(lambda field: field[0], model)


def _class_edges(ordered: np.ndarray, sizes: np.ndarray, num_bins: np.ndarray, width: int):
  """[C, width] upper bin edges of each class (``np.array_split``'s groups), ties merged,
  +inf padded, of one split's scores ``ordered`` by class, then value."""
  raw = np.full((sizes.shape[0], width), np.inf, ordered.dtype)
  if ordered.size and width:
    groups = np.maximum(num_bins, 1)[:, None]
    j = np.arange(1, width + 1)
    ends = _group_ends(sizes[:, None], groups, j)
    starts = (np.cumsum(sizes) - sizes)[:, None]
    picked = ordered[np.clip(starts + ends - 1, 0, ordered.shape[0] - 1)]
    raw = np.where(j < num_bins[:, None], picked, np.inf)
  return binning.merged_ties(raw)


def fit_splits(
  confidence: ArrayLike,
  predicted_class: ArrayLike,
  correct: ArrayLike,
  calibration: ArrayLike,
  *,
  num_classes: int | None = None,
  points_per_bin: int = DEFAULT_POINTS_PER_BIN,
  prior: bool = False,
) -> TopLabelBins:
  """``fit`` on each split's calibration part (``calibration`` [F, N] bool), every split at
  once: ``TopLabelBins`` with a leading [F] axis, split f's bit for bit ``fit`` of
  ``calibration[f]``'s examples. The other arguments as for ``fit``."""
  confidence, correct = validation.score_and_event("confidence", confidence, correct, host=True)
  classes, num_classes = _classes(predicted_class, num_classes)
  validation.same_length(confidence=confidence, predicted_class=classes)
  calibration = np.asarray(validation.bool_array("calibration", calibration, 2, host=True))
  if calibration.shape[-1] != confidence.shape[0]:
    raise ValueError(
      f"calibration: expected [F, {confidence.shape[0]}] (one row per split), "
      f"got shape {calibration.shape}"
    )
  points_per_bin = validation.positive_int("points_per_bin", points_per_bin)
  prior = base.checked_bool("prior", prior)
  u = validation.in_device_dtype(confidence)
  sizes = np.stack([np.bincount(classes[cal], minlength=num_classes) for cal in calibration])
  num_bins = sizes // points_per_bin
  # Edges padded with +inf to a power of two: one program for many data sizes.
  most = max(int(num_bins.max(initial=0)), 1) - 1
  width = 1 << (most - 1).bit_length() if most else 0
  if num_classes * (num_classes * width + 1) > _MAX_KEYS:
    raise ValueError(
      f"points_per_bin: {num_classes} classes with up to {most + 1} bins each are too many "
      f"bins to look up; raise points_per_bin above {points_per_bin}"
    )
  order = np.lexsort((u, classes))  # one sort: each split's part keeps this order
  edges = np.stack([
    _class_edges(u[order[cal[order]]], sizes[f], num_bins[f], width)
    for f, cal in enumerate(calibration)
  ])  # fmt: skip
  size = binning.bucket_size(u.shape[0])  # padded with weight 0: a program per bucket
  examples = [np.pad(x, (0, size - u.shape[0])) for x in (u, classes, correct)]
  weight = np.pad(calibration, ((0, 0), (0, size - u.shape[0])))  # bool: 1 byte an example
  per_class = _count_splits(edges, *examples, weight, prior=prior)
  with_prior = jnp.full(calibration.shape[:1], prior)
  return TopLabelBins(per_class, jnp.asarray(num_bins, jnp.int32), with_prior)


# Up to this many edges per class, each example's own edges are gathered and compared;
# beyond, one search over every class's edges keeps memory at O(N + C B).
_GATHER_MAX_EDGES = 32


def _bin_of(edges: jax.Array, u: jax.Array, classes: jax.Array) -> jax.Array:
  """[N] int32: the bin of each score among its class's edges ([C, B - 1]), right-closed."""
  num_classes, width = edges.shape
  if width == 0:
    return jnp.zeros(u.shape, jnp.int32)
  if width <= _GATHER_MAX_EDGES:
    return jax.vmap(binning.assign)(edges[classes], u)
  # By the key (class, rank of the value among every class's edges).
  values = jnp.sort(edges.reshape(-1))
  stride = values.shape[0] + 1  # ranks run over [0, C (B - 1)]
  # e < u exactly when fewer edge values lie below e than below u.
  keys = jnp.arange(num_classes, dtype=jnp.int32)[:, None] * stride
  keys = (keys + jnp.searchsorted(values, edges, side="left").astype(jnp.int32)).reshape(-1)
  mine = classes * stride + jnp.searchsorted(values, u, side="left").astype(jnp.int32)
  return (jnp.searchsorted(keys, mine, side="left") - classes * width).astype(jnp.int32)


def _bins(edges, u, classes, correct, weight, prior: bool) -> binning.Bins:
  num_classes, n_bins = edges.shape[0], edges.shape[1] + 1
  slots = 2 * (classes * n_bins + _bin_of(edges, u, classes)) + correct.astype(jnp.int32)
  by_outcome = jax.ops.segment_sum(weight.astype(jnp.int32), slots, 2 * n_bins * num_classes)
  by_outcome = by_outcome.reshape(num_classes, n_bins, 2)
  hits = by_outcome[..., 1]
  counts = by_outcome[..., 0] + hits
  accuracy = jnp.sum(hits, 1).astype(jnp.float32) / jnp.sum(counts, 1).astype(jnp.float32)
  if prior:
    prob = binning.calibrated_prob(hits, counts, accuracy[:, None])
  else:
    prob = jnp.where(counts > 0, hits / jnp.maximum(counts, 1), EMPTY_BIN_PROB)
  effective = jnp.sum(counts > 0, axis=1).astype(jnp.int32)
  return binning.Bins(edges, counts, hits, prob.astype(jnp.float32), accuracy, effective)


# The splits one at a time (lax.map, not vmap): per-example temporaries [N], not [F, N].
@functools.partial(jax.jit, static_argnames=("prior",))
def _count_splits(edges, u, classes, correct, weight, *, prior: bool) -> binning.Bins:
  one_split = lambda split: _bins(split[0], u, classes, correct, split[1], prior)
  return jax.lax.map(one_split, (edges, weight))


def _probability(per_class: binning.Bins, own, u, classes, uncalibrated) -> jax.Array:
  binned = per_class.prob[classes, _bin_of(per_class.edges, u, classes)]
  return jnp.where(own[classes], binned, uncalibrated)


_predict = jax.jit(_probability)
_predict_splits = jax.jit(
  lambda per_class, own, *args: jax.lax.map(lambda m: _probability(*m, *args), (per_class, own))
)


def _check_uncalibrated(model, confidence, classes, uncalibrated):
  """What a class without bins predicts: ``uncalibrated``, else the confidence (then a
  probability wherever it is used)."""
  if uncalibrated is not None:
    uncalibrated = validation.probability_array("uncalibrated", uncalibrated, 1, host=True)
    validation.same_length(confidence=confidence, uncalibrated=uncalibrated)
    return uncalibrated
  if validation.is_traced(confidence) or validation.is_traced(classes):
    return confidence
  lacking = ~np.asarray(model.own).reshape(-1, model.num_classes).all(axis=0)
  used = np.asarray(confidence)[lacking[np.asarray(classes)]]
  if used.size and (used.min() < 0 or used.max() > 1):
    raise ValueError(
      "confidence: a class without bins predicts its confidence unchanged, so it must be a "
      f"probability in [0, 1], got min {used.min():g}, max {used.max():g}; pass uncalibrated="
      "(e.g. the max softmax) when binning another score"
    )
  return confidence


def predict(
  model: TopLabelBins,
  confidence: ArrayLike,
  predicted_class: ArrayLike,
  uncalibrated: ArrayLike | None = None,
) -> jax.Array:
  """Calibrated P(correct): each example's bin in its class's bins (a class without bins:
  its confidence).

  Args:
    model: from ``fit``, or from ``fit_splits`` (each split's bins on every example).
    confidence: [N] float, the top-label confidence (what the bins cut).
    predicted_class: [N] int in [0, model.num_classes).
    uncalibrated: [N] float in [0, 1], what a class without bins predicts (default:
      ``confidence`` itself, the reference's choice; it must then be a probability).

  Returns:
    [N] float in [0, 1]; [F, N] for a model of ``fit_splits``.
  """
  validation.instance("model", model, TopLabelBins, "toplabel.TopLabelBins from toplabel.fit")
  confidence = validation.float_array("confidence", confidence, 1)
  classes = validation.labels_array("predicted_class", predicted_class, model.num_classes)
  validation.same_length(confidence=confidence, predicted_class=classes)
  fallback = _check_uncalibrated(model, confidence, classes, uncalibrated)
  program = _predict_splits if model.num_bins.ndim == 2 else _predict
  args = (confidence, classes, fallback)
  if any(validation.is_traced(x) for x in args):
    return program(model.per_class, model.own, *args)
  num = confidence.shape[0]  # padded to a size bucket: one program for many sizes
  size = binning.bucket_size(num)
  padded = [np.pad(np.asarray(x), (0, size - num)) for x in args]
  out = program(model.per_class, model.own, *padded)
  return jax.device_put(np.asarray(out)[..., :num])  # host slice


def to_dict(model: TopLabelBins) -> dict:
  """The fitted model as JSON values: per class its bins' count, finite edges, counts
  and hits; and whether the prior is applied."""
  host = jax.tree.map(np.asarray, model.per_class)  # one copy, then sliced on the host
  classes = []
  for c, own_bins in enumerate(np.asarray(model.num_bins).tolist()):
    edges = host.edges[c].astype(np.float64)
    slots = max(own_bins, 1)
    classes.append({
      "num_bins": own_bins,
      "edges": edges[np.isfinite(edges)].tolist(),
      "counts": host.counts[c, :slots].tolist(),
      "hits": host.hits[c, :slots].tolist(),
    })  # fmt: skip
  return {"prior": bool(model.with_prior), "classes": classes}


def _group_ends(num, groups, j: np.ndarray) -> np.ndarray:
  """The 1-based rank of the end of group j of ``num`` points cut into ``groups`` as
  ``np.array_split`` cuts them (the first ``num % groups`` one point larger)."""
  return j * (num // groups) + np.minimum(j, num % groups)


def _read_class(d, source: str) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
  """One class's saved bins, checked to be what ``fit`` makes of its counted examples."""
  num_bins = base.read_int(d, "num_bins", source, minimum=0, maximum=binning.MAX_BINS)
  edges, counts, hits = base.read_bin_table(d, source, max(num_bins, 1))
  total = int(np.sum(counts))
  if total < num_bins:
    raise ValueError(f"{source}: {num_bins} bins of {total} examples (fit makes fewer)")
  ranks = _group_ends(total, max(num_bins, 1), np.arange(1, num_bins, dtype=np.int64))
  problem = base.counts_problem(counts, edges.shape[0], ranks)
  if problem is not None:
    raise ValueError(f"{source}: not bins toplabel.fit makes: {problem}; fit them again")
  return num_bins, edges, counts, hits


def _check_points_per_bin(read: list, source: str) -> None:
  """Refuses classes whose bin counts no one ``points_per_bin`` gives: class c with n_c
  examples has floor(n_c / points_per_bin) bins."""
  low, high = 1, np.inf
  for num_bins, _, counts, _ in read:
    total = int(np.sum(counts))
    low = max(low, total // (num_bins + 1) + 1)  # fewer than num_bins + 1 bins
    if num_bins:
      high = min(high, total // num_bins)  # at least num_bins bins
  if low > high:
    raise ValueError(
      f"{source}: the classes' bin counts fit no points_per_bin (a class of n examples has"
      " floor(n / points_per_bin) bins); fit them again"
    )


def from_dict(d, source: str) -> TopLabelBins:
  """``TopLabelBins`` from ``to_dict``'s values, each checked (one-line ValueError) to be
  what ``fit`` makes; the probabilities are recomputed from the counts and hits."""
  listed = base.field(d, "classes", source)
  prior = base.field(d, "prior", source)
  if not isinstance(listed, list) or len(listed) < 2:
    raise ValueError(f"{source}: field 'classes' must be a list of bins, one per class (2 or more)")
  if not isinstance(prior, bool):
    raise ValueError(f"{source}: field 'prior' must be true or false, got {prior!r}")
  read = [_read_class(c, f"{source} (class {k})") for k, c in enumerate(listed)]
  _check_points_per_bin(read, source)
  n_bins = max(max(r[0] for r in read), 1)
  edges = np.full((len(read), n_bins - 1), np.inf, np.float32)
  counts, hits = (np.zeros((len(read), n_bins), np.int32) for _ in range(2))
  for k, (_, class_edges, class_counts, class_hits) in enumerate(read):
    edges[k, : class_edges.shape[0]] = class_edges
    counts[k, : class_counts.shape[0]], hits[k, : class_hits.shape[0]] = class_counts, class_hits
  num_bins = np.asarray([r[0] for r in read], np.int32)
  host = TopLabelBins(_host_bins(edges, counts, hits, prior), num_bins, np.bool_(prior))
  return jax.device_put(host)


def _host_bins(edges, counts, hits, prior: bool) -> binning.Bins:
  """``Bins`` of saved counts on the host, in float32 as ``_bins`` computes them."""
  f32 = np.float32
  with np.errstate(invalid="ignore", divide="ignore"):  # a class never predicted: NaN
    accuracy = hits.sum(1).astype(f32) / counts.sum(1).astype(f32)
    if prior:
      prob = binning.calibrated_prob(hits.astype(f32), counts.astype(f32), accuracy[:, None])
    else:
      prob = np.where(
        counts > 0, hits.astype(f32) / np.maximum(counts, 1).astype(f32), f32(EMPTY_BIN_PROB)
      )
  effective = np.sum(counts > 0, axis=1).astype(np.int32)
  return binning.Bins(edges, counts, hits, prob.astype(f32), accuracy.astype(f32), effective)


def _confidence_and_class(evidence: base.Evidence) -> tuple[np.ndarray, np.ndarray]:
  log_probs = evidence.log_probs
  confidence = -np.asarray(scores.compute_one(scores.topk_name(evidence.k), log_probs))
  return confidence, np.asarray(np.argmax(log_probs, axis=-1))


def _fit_evidence(
  evidence: base.Evidence, *, points_per_bin: int = DEFAULT_POINTS_PER_BIN, prior: bool = False
):
  confidence, classes = _confidence_and_class(evidence)
  return fit(
    confidence, classes, evidence.correct,
    points_per_bin=points_per_bin, prior=prior, num_classes=evidence.log_probs.shape[-1],
  )  # fmt: skip


def _predict_evidence(model: TopLabelBins, evidence: base.Evidence) -> jax.Array:
  log_mass, classes = _confidence_and_class(evidence)
  # A class without bins gets the top-k mass itself (the reference's identity).
  return predict(model, log_mass, classes, uncalibrated=np.exp(log_mass))


def _fit_splits_evidence(
  evidence: base.Evidence,
  calibration: np.ndarray,
  *,
  points_per_bin: int = DEFAULT_POINTS_PER_BIN,
  prior: bool = False,
) -> base.SplitFit:
  """``fit_splits`` on every split's calibration part, each predicting every example."""
  log_mass, classes = _confidence_and_class(evidence)
  model = fit_splits(
    log_mass, classes, evidence.correct, calibration, num_classes=evidence.log_probs.shape[-1],
    points_per_bin=points_per_bin, prior=prior,
  )  # fmt: skip
  uncalibrated = np.exp(log_mass)

  def split(f):
    model_f = jax.tree.map(lambda x: x[f], model)
    return predict(model_f, log_mass, classes, uncalibrated=uncalibrated), {}

  own = np.sum(np.asarray(model.own), axis=-1).astype(np.float64)
  return base.SplitFit(split, {"classes_with_own_bins": own})


ESTIMATOR = base.Estimator(
  name="toplabel",
  needs="log_probs",
  fit=_fit_evidence,
  predict=_predict_evidence,
  to_dict=to_dict,
  from_dict=from_dict,
  options=("points_per_bin", "prior"),
  fit_splits=_fit_splits_evidence,
  option_checks={
    "points_per_bin": functools.partial(validation.positive_int, "points_per_bin"),
    "prior": functools.partial(base.checked_bool, "prior"),
  },
)
"""Equal-mass bins of the top-k mass per predicted class (Gupta & Ramdas 2022)."""
