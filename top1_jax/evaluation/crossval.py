"""Cross-validated scoring of any registered estimator of P(correct | U) (paper §5.1).

``cross_validate`` looks the estimator up in ``estimators.registry``: one with a fast
path (the bins: every split and bin count from one sort, ``estimators.bins_crossval``)
takes it; any other is fitted and predicted split by split through its ``fit`` and
``predict``, and scored on the same splits with the same metrics, so the rows compare.

That generic loop is built of three public steps, which ``evaluation.shift`` (calibrate
on clean data, test on shifted sets) uses as well, so both protocols count and score
alike: ``held_out_bins`` (a split's calibration bins of U and where the test examples of
one or several test sets fall), ``binned_predictions`` (an estimator's test predictions
counted in those bins) and ``split_metrics`` (``METRICS`` from every split's counts).

The splits and the record of a cross-validation live in ``core.splits`` (the bins'
nested choice of a bin count uses them below this layer); they are re-exported here,
where the rest of the library and the users find them: ``crossval.make_splits``,
``crossval.Splits``, ``crossval.CrossValidation``, ``crossval.METRICS``, ...
"""

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import binning, metrics, validation
from top1_jax.core.splits import (
  METRICS,
  SCHEMES,
  UNDEFINABLE,
  CrossValidation,
  Splits,
  make_splits,
)
from top1_jax.estimators import base, registry
from top1_jax.kernels import compile_policy

__all__ = [
  "ESTIMATORS",
  "METRICS",
  "SCHEMES",
  "UNDEFINABLE",
  "CrossValidation",
  "HeldOutBins",
  "BinnedPredictions",
  "Splits",
  "checked_bin_counts",
  "cross_validate",
  "held_out_bins",
  "make_splits",
  "binned_predictions",
  "split_metrics",
]

ESTIMATORS = registry.names(scores_only=True)
"""The registered estimators ``cross_validate`` can score from (U, correct) alone, as
registered at import (``registry.names(scores_only=True)`` reads the registry now)."""


def _bin_counts(n_bins) -> tuple:
  """One bin count or a sequence of them, as a tuple (values are checked later)."""
  if isinstance(n_bins, (int, np.integer)) and not isinstance(n_bins, bool):
    return (n_bins,)
  if isinstance(n_bins, (str, bytes)) or not hasattr(n_bins, "__iter__"):
    raise ValueError(f"n_bins: expected an integer or a sequence of integers, got {n_bins!r}")
  n_bins = tuple(n_bins)
  if not n_bins:
    raise ValueError("n_bins: expected at least one bin count, got none")
  return n_bins


def cross_validate(
  u: ArrayLike,
  correct: ArrayLike,
  n_bins: int | Sequence[int] = (10, 20, 100),
  n_folds: int = 10,
  seed: int = 0,
  scheme: str = "halves",
  splits: Splits | None = None,
  estimator: str = "bins",
  increasing: bool = False,
  **options,
) -> CrossValidation:
  """Cross-validated Brier, NLL, ECE, EOR, AUROC and decompositions per bin count.

  With the bins (the default), each split fits equal-count bins on its calibration
  part (probabilities with the one-pseudo-count prior at the calibration accuracy)
  and scores the held-out part: Brier and NLL with their decompositions, ECE against
  the test accuracy per bin, EOR of the predicted bin probabilities (test weights,
  base rate the calibration accuracy), and AUROC of the predictions (ties within a
  bin count one half). All splits and bin counts are computed together from one sort.

  Any other registered estimator fitted on (U, correct) alone ("isotonic", "kde", ...)
  is fitted and predicted split by split. Brier and NLL are the per-example means of
  its test predictions. ECE, EOR, AUROC and the decompositions' terms use the
  calibration part's equal-count bins of U (for each bin count), the test counts and
  hits per bin and, as each bin's prediction, the estimator's mean test prediction
  there; for the bins, whose predictions are constant in a bin, these are the
  definitions above, so the rows compare. Brier and NLL do not depend on the bin
  count, and their decomposition terms need not add up to them (the difference is
  the spread of predictions within a bin).

  Args:
    u: [N] float scores.
    correct: [N] bool events.
    n_bins: one bin count or several; each at least 1 and at most the smallest
      calibration split.
    n_folds: number of splits (>= 2).
    seed: seed of the random splits.
    scheme: "halves" (paper: calibrate on half, test on the other half) or
      "kfold"; see ``make_splits``.
    splits: explicit splits (overrides n_folds, seed and scheme), e.g. to score
      several uncertainty measures on the same splits.
    estimator: a name of ``estimators.registry.REGISTRY`` whose estimator is fitted
      on the scores alone (``registry.names(scores_only=True)``); one that needs the
      model's log-probabilities (toplabel, temperature) is refused.
    increasing: for an estimator with an ``increasing`` option (isotonic): P(correct)
      grows with ``u`` (a confidence such as pmax); the default is an uncertainty,
      P(correct) non-increasing in ``u``. Ignored by the others.
    **options: further options of the estimator's ``fit`` (e.g. kde's ``bandwidth``).

  Returns:
    ``CrossValidation`` with per-split values, mean and std of ``METRICS``.
  """
  entry = registry.lookup(estimator)
  if "increasing" in entry.options:
    options = {"increasing": increasing, **options}
  options = entry.check_options(options)
  if not entry.scores_only:
    raise ValueError(
      f"estimator: {estimator!r} needs the model's log-probabilities, cross_validate has the"
      f" scores U alone (it runs: {', '.join(registry.names(scores_only=True))})"
    )
  # Everything before the metrics runs in NumPy on the host (see bins_crossval).
  u_host = validation.float_array("u", u, 1, host=True)
  correct_host = validation.bool_array("correct", correct, host=True)
  num = validation.same_length(u=u_host, correct=correct_host)
  if num < 2:
    raise ValueError(f"u: cross-validation needs at least 2 examples, got {num}")
  n_bins = _bin_counts(n_bins)
  if splits is None:
    splits = make_splits(num, n_folds, seed, scheme)
  elif splits.fold.shape[-1] != num:
    raise ValueError(f"splits: made for {splits.fold.shape[-1]} examples, u has {num}")
  if entry.cross_validate is not None:
    return entry.cross_validate(u_host, correct_host, n_bins, splits, **options)
  return _cross_validate_estimator(u_host, correct_host, n_bins, splits, entry, options)


class HeldOutBins(NamedTuple):
  """One split: the calibration part's equal-count bins of U and where the test examples
  of S test sets (the same examples, e.g. clean and shifted) fall in them.

  Attributes:
    n_bins: the bin counts B, in order; W = max(n_bins) slots per bin count.
    cal_counts: [B, W] float32, calibration examples per bin (zero beyond n).
    prior: float, the calibration accuracy (``binning.Bins.prior``).
    slots: [B, S * T] int, bin + W * set of each test example, the sets one after
      another.
    correct: [S * T] bool, the test events in that order.
    test_counts, test_hits: [S, B, W] float32, test examples and correct ones per bin.
  """

  n_bins: tuple[int, ...]
  cal_counts: np.ndarray
  prior: float
  slots: np.ndarray
  correct: np.ndarray
  test_counts: np.ndarray
  test_hits: np.ndarray

  @property
  def num_sets(self) -> int:
    return self.test_counts.shape[0]


def held_out_bins(u_cal, correct_cal, u_test, correct_test, n_bins: tuple[int, ...]) -> HeldOutBins:
  """The calibration part's bins of U (one ``binning.fit`` per bin count) and the test
  sets' counts in them, one ``bincount`` over (set, bin) per bin count.

  Unchecked host arrays: ``u_cal`` [M] float and ``correct_cal`` [M] bool; ``u_test``
  [S, T] float and ``correct_test`` [S, T] bool; bin counts in [1, M].
  """
  num_sets = u_test.shape[0]
  width = max(n_bins)
  offsets = np.repeat(np.arange(num_sets) * width, u_test.shape[1])
  u_flat, correct_flat = u_test.reshape(-1), correct_test.reshape(-1)
  cal_counts = np.zeros((len(n_bins), width), np.float32)
  slots = np.empty((len(n_bins), u_flat.shape[0]), np.int64)
  for b, n in enumerate(n_bins):
    bins = binning.fit(u_cal, correct_cal, n)
    cal_counts[b, :n] = bins.counts
    slots[b] = offsets + np.asarray(binning.assign(bins.edges, u_flat))
  size = num_sets * width
  counts = np.stack([np.bincount(s, minlength=size) for s in slots])
  hits = np.stack([np.bincount(s, correct_flat, size) for s in slots])
  shape = (len(n_bins), num_sets, width)
  test_counts, test_hits = (np.moveaxis(x.reshape(shape), 1, 0) for x in (counts, hits))
  prior = float(bins.prior)
  return HeldOutBins(
    n_bins,
    cal_counts,
    prior,
    slots,
    correct_flat,
    *(x.astype(np.float32) for x in (test_counts, test_hits)),
  )


class BinnedPredictions(NamedTuple):
  """One split's sufficient statistics of an estimator's test predictions, per test set.

  Attributes:
    n_bins, cal_counts ([B, W] float32) and prior (float): ``HeldOutBins``'.
    test_counts, test_hits, prediction_means: [S, B, W] float32: test examples, correct
      ones and their mean predicted P(correct) (0 where none), per calibration bin. The
      mean is taken in float64, so that a bin of equal predictions (the bins') gets
      exactly that value and bins of equal values tie.
    brier, nll: [S, B] float, each set's per-example mean Brier and NLL.
  """

  n_bins: tuple[int, ...]
  cal_counts: np.ndarray
  prior: float
  test_counts: np.ndarray
  test_hits: np.ndarray
  prediction_means: np.ndarray
  brier: np.ndarray
  nll: np.ndarray


@jax.jit
def _example_terms(p, correct):
  p = p.astype(jnp.float32)
  return metrics.brier_terms(p, correct), metrics.nll_terms(p, correct)


def binned_predictions(test: HeldOutBins, p) -> BinnedPredictions:
  """An estimator's test predictions counted in ``test``'s bins (one ``bincount`` each).

  Args:
    test: ``held_out_bins`` of the split.
    p: [S * T] float P(correct) of the test examples (in ``test.slots``' order), or
      [B, S * T]: one prediction per bin count (an estimator fitted at each).

  Returns:
    ``BinnedPredictions``.
  """
  num_sets, num_bin_counts = test.num_sets, len(test.n_bins)
  shared = np.ndim(p) == 1
  p = np.broadcast_to(np.asarray(p, np.float64), test.slots.shape)
  size = num_sets * max(test.n_bins)
  sums = np.stack([np.bincount(s, w, size) for s, w in zip(test.slots, p, strict=True)])
  sums = np.moveaxis(sums.reshape(num_bin_counts, num_sets, -1), 1, 0)
  means = (sums / np.maximum(test.test_counts, 1)).astype(np.float32)
  # Each set's mean of the per-example terms (one row when p is shared by the bin counts).
  rows = p[:1] if shared else p
  terms = (np.asarray(x, np.float64) for x in _example_terms(rows, test.correct[None]))
  brier, nll = (x.reshape(rows.shape[0], num_sets, -1).mean(-1).T for x in terms)
  shape = (num_sets, num_bin_counts)
  return BinnedPredictions(
    test.n_bins, test.cal_counts, test.prior, test.test_counts, test.test_hits, means,
    np.broadcast_to(brier, shape), np.broadcast_to(nll, shape),
  )  # fmt: skip


def split_metrics(per_split: Sequence[BinnedPredictions]) -> dict[str, np.ndarray]:
  """``METRICS`` of an estimator from each split's ``BinnedPredictions``, every test set.

  Brier and NLL are the per-example means of the test predictions. ECE, EOR, AUROC
  and the decompositions' terms use the calibration bins, the test counts and hits
  per bin and, as each bin's prediction, the mean test prediction there (an empty
  bin: the calibration accuracy); ``cross_validate`` documents them.

  Returns:
    metric name -> [S, B, F] float array (NaN where undefined).
  """
  # The splits axis goes before the bins: [B, F, W], [F], [S, B, F, W] and [S, B, F].
  splits_axis = {"prior": 0, "brier": -1, "nll": -1}
  stacked = {
    name: np.stack([getattr(sums, name) for sums in per_split], axis=splits_axis.get(name, -2))
    for name in BinnedPredictions._fields[1:]
  }
  # One bin count at a time, each at its own width: AUROC's cost grows as the square.
  values = []
  for b, n in enumerate(per_split[0].n_bins):
    bins = {"cal_counts": stacked["cal_counts"][b : b + 1, :, :n], "prior": stacked["prior"]}
    bins |= {name: stacked[name][:, b : b + 1, :, :n] for name in _PER_BIN}
    bins |= {name: stacked[name][:, b : b + 1] for name in ("brier", "nll")}
    values.append(_metrics_of_sums(**bins))
  return {name: np.concatenate([v[name] for v in values], axis=1) for name in METRICS}


_PER_BIN = ("test_counts", "test_hits", "prediction_means")


@compile_policy.jit_small
def _metrics_of_sums(cal_counts, prior, test_counts, test_hits, prediction_means, brier, nll):
  shape = test_counts.shape[:-1]  # [S, B, F]
  prior = jnp.broadcast_to(prior, shape)
  prob = jnp.where(test_counts > 0, prediction_means, prior[..., None])
  cal_counts = jnp.broadcast_to(cal_counts, test_counts.shape)
  brier_bins = metrics.brier_from_counts(prob, test_counts, test_hits)
  nll_bins = metrics.nll_from_counts(prob, test_counts, test_hits)
  return {
    "accuracy": jnp.sum(test_hits, -1) / jnp.sum(test_counts, -1),
    "brier": brier,
    "brier_uncertainty": brier_bins.uncertainty,
    "brier_resolution": brier_bins.resolution,
    "brier_calibration": brier_bins.calibration,
    "nll": nll,
    "nll_uncertainty": nll_bins.uncertainty,
    "nll_resolution": nll_bins.resolution,
    "nll_calibration": nll_bins.calibration,
    **metrics.binned_metrics(prob, prior, cal_counts, test_counts, test_hits),
  }


def checked_bin_counts(n_bins, splits: Splits) -> tuple[int, ...]:
  """``n_bins`` (one bin count or a sequence) as a tuple, each in [1, the smallest
  calibration part of ``splits``]; every split needs a test example."""
  n_bins = _bin_counts(n_bins)
  test_sizes = np.array([splits.test_mask(f).sum() for f in range(splits.num_splits)])
  if int(test_sizes.min()) < 1:
    raise ValueError("splits: a split has no test examples")
  smallest_cal = int(splits.fold.shape[-1] - test_sizes.max())
  return tuple(validation.positive_int("n_bins", n, maximum=smallest_cal) for n in n_bins)


def _cross_validate_estimator(u, correct, n_bins, splits: Splits, entry, options):
  """``cross_validate`` through an estimator's fit and predict (see its docstring)."""
  n_bins = checked_bin_counts(n_bins, splits)
  per_split = []
  for split in range(splits.num_splits):
    test = splits.test_mask(split)
    u_cal, correct_cal, u_test = u[~test], correct[~test], u[test]
    state = entry.fit(base.Evidence(u_cal, correct_cal), **options)
    p = entry.predict(state, base.Evidence(u_test))
    binned = held_out_bins(u_cal, correct_cal, u_test[None], correct[test][None], n_bins)
    per_split.append(binned_predictions(binned, p))
  per_fold = split_metrics(per_split)
  return CrossValidation.from_per_fold(n_bins, {name: v[0] for name, v in per_fold.items()})
