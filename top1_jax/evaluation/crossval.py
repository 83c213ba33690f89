"""Cross-validated scoring of any registered estimator of P(correct | U) (paper §5.1).

``cross_validate`` looks the estimator up in ``estimators.registry``: one with a fast
path (the bins: every split and bin count from one sort, ``estimators.bins_crossval``)
takes it; any other is fitted and predicted split by split through its ``fit`` and
``predict``, and scored on the same splits with the same metrics, so the rows compare.

The splits and the record of a cross-validation live in ``core.splits`` (the bins'
nested choice of a bin count uses them below this layer); they are re-exported here,
where the rest of the library and the users find them: ``crossval.make_splits``,
``crossval.Splits``, ``crossval.CrossValidation``, ``crossval.METRICS``, ...
"""

from collections.abc import Sequence

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
  "Splits",
  "cross_validate",
  "make_splits",
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


def _estimator_counts(u, correct, splits: Splits, n_bins: tuple, entry: base.Estimator, options):
  """Split by split: fit, predict, and sum the test data in each calibration bin.

  Returns:
    cal_counts, test_counts, test_hits, prediction_sums: [B, F, max(n_bins)];
    prior (the calibration accuracy), brier, nll: [F].
  """
  width = max(n_bins)
  binned = np.zeros((4, len(n_bins), splits.num_splits, width), np.float32)
  per_split = np.zeros((3, splits.num_splits), np.float32)
  for split in range(splits.num_splits):
    test = splits.test_mask(split)
    u_cal, correct_cal, u_test, correct_test = u[~test], correct[~test], u[test], correct[test]
    state = entry.fit(base.Evidence(u_cal, correct_cal), **options)
    p = np.asarray(entry.predict(state, base.Evidence(u_test)), np.float64)
    for b, n in enumerate(n_bins):
      bins = binning.fit(u_cal, correct_cal, n)
      index = np.asarray(binning.assign(bins.edges, u_test))
      binned[0, b, split, :n] = bins.counts
      binned[1, b, split] = np.bincount(index, minlength=width)
      binned[2, b, split] = np.bincount(index, correct_test, width)
      binned[3, b, split] = np.bincount(index, p, width)
    per_split[:, split] = bins.prior, metrics.brier(p, correct_test), metrics.nll(p, correct_test)
  return (*binned, *per_split)


@compile_policy.jit_small
def _estimator_metrics(cal_counts, test_counts, test_hits, prediction_sums, prior, brier, nll):
  prior = jnp.broadcast_to(prior, test_counts.shape[:-1])  # [B, F]
  prob = jnp.where(
    test_counts > 0, prediction_sums / jnp.maximum(test_counts, 1.0), prior[..., None]
  )
  brier_bins = metrics.brier_from_counts(prob, test_counts, test_hits)
  nll_bins = metrics.nll_from_counts(prob, test_counts, test_hits)
  return {
    "accuracy": jnp.sum(test_hits, -1) / jnp.sum(test_counts, -1),
    "brier": jnp.broadcast_to(brier, prior.shape),
    "brier_uncertainty": brier_bins.uncertainty,
    "brier_resolution": brier_bins.resolution,
    "brier_calibration": brier_bins.calibration,
    "nll": jnp.broadcast_to(nll, prior.shape),
    "nll_uncertainty": nll_bins.uncertainty,
    "nll_resolution": nll_bins.resolution,
    "nll_calibration": nll_bins.calibration,
    **metrics.binned_metrics(prob, prior, cal_counts, test_counts, test_hits),
  }


def _cross_validate_estimator(u, correct, n_bins: tuple, splits: Splits, entry, options):
  """``cross_validate`` through an estimator's fit and predict (see its docstring)."""
  test_sizes = np.array([splits.test_mask(f).sum() for f in range(splits.num_splits)])
  if int(test_sizes.min()) < 1:
    raise ValueError("splits: a split has no test examples")
  smallest_cal = int(u.shape[0] - test_sizes.max())
  n_bins = tuple(validation.positive_int("n_bins", n, maximum=smallest_cal) for n in n_bins)
  counts = _estimator_counts(u, correct, splits, n_bins, entry, options)
  return CrossValidation.from_per_fold(n_bins, _estimator_metrics(*counts))
