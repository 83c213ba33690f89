"""The model's own probability as P(correct), nothing fitted: a method like the others.

Ovadia et al.'s "Vanilla", "Dropout" and "Ensemble": the Top-k mass of the (mean)
log-probabilities, registered so every protocol finds it by name; its state is empty.
"""

import numpy as np

from top1_jax.core import events, scores
from top1_jax.estimators import base


def _predict(_, evidence: base.Evidence) -> np.ndarray:
  name = scores.topk_name(evidence.k)
  return np.exp(-np.asarray(scores.compute_one(name, evidence.log_probs), np.float64))


def _fit_splits(evidence: base.Evidence, calibration: np.ndarray) -> base.SplitFit:
  """The same prediction for every split; with labels, each example's multiclass Brier."""
  per_example = {}
  if evidence.labels is not None:
    terms = events.label_terms(evidence.log_probs, evidence.labels)
    per_example["multiclass_brier"] = terms.multiclass_brier
  p = _predict(None, evidence)
  return base.SplitFit(lambda f: (p, per_example))


ESTIMATOR = base.Estimator(
  name="raw",
  needs="log_probs",
  fit=lambda evidence: None,
  predict=_predict,
  to_dict=lambda state: {},
  from_dict=lambda d, source: None,
  fit_splits=_fit_splits,
)
