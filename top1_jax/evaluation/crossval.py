"""Cross-validated scoring of any registered estimator of P(correct | U) (paper §5.1).

``cross_validate`` is ``evaluation.protocol`` on one score; ``core.splits``' names are
re-exported here.
"""

from collections.abc import Sequence

from jax.typing import ArrayLike

from top1_jax.core import validation
from top1_jax.core.splits import METRICS, SCHEMES, UNDEFINABLE, CrossValidation, Splits, make_splits
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
"""The estimators ``cross_validate`` can score from (U, correct) alone, as registered at
import."""

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

  Each split fits the estimator on its calibration part and scores the held-out part as
  ``protocol.evaluate`` does.

  Args:
    u: [N] float scores.
    correct: [N] bool events.
    n_bins: one bin count or several, each in [1, the smallest calibration split].
    n_folds: number of splits (>= 2), made by ``make_splits`` with ``seed`` and ``scheme``
      ("halves", the paper's, or "kfold").
    splits: explicit splits (overriding those three), e.g. to score several uncertainty
      measures on the same splits.
    estimator: a registered estimator fitted on the scores alone (``ESTIMATORS``).
    increasing: for an estimator with an ``increasing`` option (isotonic): P(correct)
      grows with ``u`` (a confidence such as pmax); the default is an uncertainty.
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
  u_host = validation.float_array("u", u, 1, host=True)
  correct_host = validation.bool_array("correct", correct, host=True)
  num = validation.same_length(u=u_host, correct=correct_host)
  if num < 2:
    raise ValueError(f"u: cross-validation needs at least 2 examples, got {num}")
  if splits is None:
    splits = make_splits(num, n_folds, seed, scheme)
  protocol.check_splits(splits, num, "u")
  n_bins = protocol.bin_counts(n_bins, splits)
  data = protocol.Data(correct_host, {_SCORE: u_host})
  (result,) = protocol.evaluate_checked(data, splits, [method], None, n_bins, k=1)
  return result.metrics
