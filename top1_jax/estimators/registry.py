"""Every estimator of P(correct | U) by name: the one list that the Calibrator, the
config check and cross-validation read. (Being filled in: see estimators/base.py.)"""

_SCORE_ONLY = ("bins", "isotonic", "kde")


def names(*, scores_only: bool = False) -> tuple[str, ...]:
  """The registered names, in order; ``scores_only``: those fitted on (U, correct) alone,
  which cross-validation of a score can run (no log-probabilities needed)."""
  return _SCORE_ONLY if scores_only else (*_SCORE_ONLY, "toplabel", "temperature")
