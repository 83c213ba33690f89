"""Every estimator of P(correct) by name: the one list the Calibrator, the config check and
cross-validation read, at call time (so an entry added later, e.g. a test's toy, is found).
"""

from top1_jax.estimators import base, bins, isotonic, kde, raw, temperature, toplabel

REGISTRY: dict[str, base.Estimator] = {
  module.ESTIMATOR.name: module.ESTIMATOR
  for module in (bins, isotonic, kde, toplabel, temperature, raw)
}
"""Every estimator by name, in the order tables list them."""


def names(*, scores_only: bool = False) -> tuple[str, ...]:
  """The registered names, in order; ``scores_only``: those fitted on (U, correct) alone."""
  return tuple(name for name, entry in REGISTRY.items() if entry.scores_only or not scores_only)


def lookup(name: str) -> base.Estimator:
  """The entry of ``name``, or a one-line ValueError listing the registered names."""
  entry = REGISTRY.get(name) if isinstance(name, str) else None
  if entry is None:
    raise ValueError(f"estimator: expected one of {', '.join(REGISTRY)}, got {name!r}")
  return entry
