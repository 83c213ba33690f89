"""The model's own probability as P(correct), nothing fitted: a method like the others.

Ovadia et al.'s "Vanilla" (of one network), "Dropout" and "Ensemble" (of the mean of
MC-dropout samples or ensemble members): the Top-k mass of the log-probabilities,
``exp(-neg_log_topk_mass)``. Registered so that every protocol, table and calibrator
finds it by name like any estimator; its state is empty.
"""

import numpy as np

from top1_jax.core import events, scores
from top1_jax.estimators import base


def _predict(_, evidence: base.Evidence) -> np.ndarray:
  name = scores.topk_name(evidence.k)
  return np.exp(-np.asarray(scores.compute_one(name, evidence.log_probs), np.float64))


def _fit_splits(evidence: base.Evidence, calibration: np.ndarray) -> base.SplitFit:
  """The same prediction for every split; with labels, each example's multiclass Brier."""
  extras = {}  # nothing is fitted: the calibration parts do not matter
  if evidence.labels is not None:
    terms = events.label_terms(evidence.log_probs, evidence.labels)
    extras["multiclass_brier"] = np.broadcast_to(terms.multiclass_brier, calibration.shape)
  return base.SplitFit(_predict(None, evidence), extras)


ESTIMATOR = base.Estimator(
  name="raw",
  needs="log_probs",
  fit=lambda evidence: None,
  predict=_predict,
  to_dict=lambda state: {},
  from_dict=lambda d, source: None,
  fit_splits=_fit_splits,
)
"""The Top-k mass of the model's own softmax (or of the mean of its samples)."""
