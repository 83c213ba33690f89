"""Cross-validated scoring of any registered estimator of P(correct | U) (paper §5.1).

``cross_validate`` is the evaluation protocol (``evaluation.protocol``) on one score,
each split's held-out part scored: the bins take their fast path (every split and bin
count from one sort, ``estimators.bins_crossval``), any other estimator on U is fitted
and predicted split by split, on the same splits with the same metrics.

The splits and the record of a cross-validation live in ``core.splits`` (the bins'
nested choice of a bin count uses them below this layer); the names users reach for
here are imported from there: ``make_splits``, ``Splits``, ``CrossValidation``, ``METRICS``.
"""

from collections.abc import Sequence

from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.core.splits import (
  METRICS,
  SCHEMES,
  UNDEFINABLE,
  CrossValidation,
  Splits,
  make_splits,
)
from top1_jax.estimators import registry
from top1_jax.evaluation import protocol

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

_SCORE = "u"  # the one score's name in the protocol's set


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
  if not entry.scores_only:
    raise ValueError(
      f"estimator: {estimator!r} needs the model's log-probabilities, cross_validate has the"
      f" scores U alone (it runs: {', '.join(registry.names(scores_only=True))})"
    )
  if "increasing" in entry.options:
    options = {"increasing": increasing, **options}
  method = protocol.method(estimator, _SCORE, options)
  # Everything before the metrics runs in NumPy on the host (see bins_crossval).
  u_host = validation.float_array("u", u, 1, host=True)
  correct_host = validation.bool_array("correct", correct, host=True)
  num = validation.same_length(u=u_host, correct=correct_host)
  if num < 2:
    raise ValueError(f"u: cross-validation needs at least 2 examples, got {num}")
  if splits is None:
    splits = make_splits(num, n_folds, seed, scheme)
  elif splits.fold.shape[-1] != num:
    raise ValueError(f"splits: made for {splits.fold.shape[-1]} examples, u has {num}")
  n_bins = protocol.bin_counts(n_bins, splits)
  data = protocol.Data(correct_host, {_SCORE: u_host})
  (result,) = protocol.evaluate_checked(data, splits, [method], None, n_bins, k=1)
  return result.metrics
