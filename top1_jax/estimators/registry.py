"""Every estimator of P(correct) by name: the one list that the Calibrator, the config
check and cross-validation read.

Adding an estimator is one module (its maths and a ``base.Estimator`` entry) and one
line in ``REGISTRY`` below; nothing else names estimators. Callers look entries up at
call time, so an entry added to ``REGISTRY`` (a test's toy, a plug-in) is found by
``Calibrator(method=...)`` and ``crossval.cross_validate(estimator=...)`` alike.
"""

from top1_jax.estimators import base, bins, isotonic, kde, raw, temperature, toplabel

REGISTRY: dict[str, base.Estimator] = {
  entry.name: entry
  for entry in (
    bins.ESTIMATOR,
    isotonic.ESTIMATOR,
    kde.ESTIMATOR,
    toplabel.ESTIMATOR,
    temperature.ESTIMATOR,
    raw.ESTIMATOR,
  )
}
"""Every estimator by name, in the order tables list them."""


def names(*, scores_only: bool = False) -> tuple[str, ...]:
  """The registered names, in order; ``scores_only``: those fitted on (U, correct) alone,
  which cross-validation of a score can run (no log-probabilities needed)."""
  return tuple(name for name, entry in REGISTRY.items() if entry.scores_only or not scores_only)


def lookup(name: str) -> base.Estimator:
  """The entry of ``name``, or a one-line ValueError listing the registered names."""
  entry = REGISTRY.get(name) if isinstance(name, str) else None
  if entry is None:
    raise ValueError(f"estimator: expected one of {', '.join(REGISTRY)}, got {name!r}")
  return entry
