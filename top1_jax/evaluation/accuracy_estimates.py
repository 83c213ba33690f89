"""What accuracy to expect on unlabelled inputs: estimators fitted on clean labelled data.

Each estimator predicts the accuracy of a set of unlabelled inputs as the mean over
them of a per-example value, fitted on the clean calibration part of each split of the
evaluation protocol (``protocol.fit_predict`` fits the calibrated methods):

* ``average_confidence``: the model's own probability (pmax for Top-1);
* ``doc`` (difference of confidences, Guillory et al. 2021): the clean accuracy minus
  the drop in average confidence, i.e. each example's confidence plus
  (clean accuracy - clean average confidence);
* ``calibrated`` (the paper's): the calibrated P(correct) of the clean bins of a score;
* ``atc`` (average thresholded confidence, Garg et al. 2022): the threshold t on a
  score that the clean calibration scores exceed as often as the model is right there;
  the predicted accuracy is the fraction of inputs above t. Here with any score of
  ``core.scores`` (max confidence, negative entropy, the covariance norms of MC dropout
  and ensembles), oriented so that high means confident. Scores equal to t count with
  the weight that makes the clean fraction equal the clean accuracy exactly (a tied
  score, such as pmax at 1.0 in float32, then still gives the clean accuracy back).

A predicted accuracy is clipped to [0, 1] (DoC's can leave it).
"""

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import scores as score_registry
from top1_jax.core.splits import Splits
from top1_jax.estimators import base
from top1_jax.evaluation import protocol


class Threshold(NamedTuple):
  """ATC's threshold on a score oriented so that high means confident.

  Attributes:
    value: t.
    tie_weight: the share of a score equal to t counted as above it, in [0, 1].
  """

  value: float
  tie_weight: float


class Reference(NamedTuple):
  """What clean labelled data tells the estimators.

  Attributes:
    accuracy: its accuracy.
    confidence: its mean confidence (the model's own P(correct)).
    thresholds: score name -> ATC's ``Threshold``.
  """

  accuracy: float
  confidence: float
  thresholds: Mapping[str, Threshold]


class Views(NamedTuple):
  """What an estimator reads of M unlabelled inputs (a score's fields: None without one).

  Attributes:
    confidence: [M] the model's own P(correct).
    score: the score's name.
    u: [M] its values.
    p_correct: [M] the calibrated P(correct), fitted on clean data, of that score.
  """

  confidence: np.ndarray
  score: str | None = None
  u: np.ndarray | None = None
  p_correct: np.ndarray | None = None


def oriented(score: str, u: ArrayLike) -> np.ndarray:
  """``u`` as a confidence: negated for an uncertainty (and for a score the registry
  does not know: a stored score is an uncertainty, as the predictions files' are)."""
  known = score_registry.lookup(score)
  high = known is not None and known.confident_when_high
  return np.asarray(u, np.float64) * (1.0 if high else -1.0)


def atc_threshold(confidence: ArrayLike, correct: ArrayLike) -> Threshold:
  """ATC's threshold: the clean scores above t (ties at t weighted) are as many as the hits.

  Args:
    confidence: [N] a score oriented so that high means confident (``oriented``).
    correct: [N] bool.
  """
  values = np.sort(np.asarray(confidence, np.float64))[::-1]
  hits = int(np.count_nonzero(correct))
  t = values[max(hits - 1, 0)]
  above, ties = np.count_nonzero(values > t), np.count_nonzero(values == t)
  return Threshold(float(t), float(np.clip((hits - above) / ties, 0.0, 1.0)))


def above(threshold: Threshold, confidence: ArrayLike) -> np.ndarray:
  """[M] float: 1 above the threshold, its tie weight at it, 0 below."""
  confidence = np.asarray(confidence, np.float64)
  at = np.where(confidence == threshold.value, threshold.tie_weight, 0.0)
  return np.where(confidence > threshold.value, 1.0, at)


def reference(correct: ArrayLike, confidence: ArrayLike, u: Mapping[str, ArrayLike]) -> Reference:
  """The ``Reference`` of clean labelled data: [N] events, confidences and scores by name."""
  correct = np.asarray(correct, bool)
  thresholds = {name: atc_threshold(oriented(name, values), correct) for name, values in u.items()}
  return Reference(
    float(np.mean(correct)), float(np.mean(np.asarray(confidence, np.float64))), thresholds
  )


@dataclasses.dataclass(frozen=True)
class AccuracyEstimator:
  """A label-free estimator of accuracy by name.

  Attributes:
    name: the registry key (``accuracy_estimates.csv``'s ``estimator``).
    title: how tables and figures name it.
    on_score: one estimate per score (else of the model's confidence alone).
    per_example: ``per_example(reference, views) -> [M]``, whose mean is the estimate.
  """

  name: str
  title: str
  on_score: bool
  per_example: Callable[[Reference, Views], np.ndarray]


ESTIMATORS: dict[str, AccuracyEstimator] = {
  e.name: e
  for e in (
    AccuracyEstimator(
      "average_confidence", "average confidence", False, lambda ref, v: v.confidence
    ),
    AccuracyEstimator(
      "doc", "DoC", False, lambda ref, v: v.confidence + (ref.accuracy - ref.confidence)
    ),
    AccuracyEstimator("calibrated", "the paper's bins", True, lambda r, v: v.p_correct),
    AccuracyEstimator(
      "atc", "ATC", True, lambda ref, v: above(ref.thresholds[v.score], oriented(v.score, v.u))
    ),
  )
}
"""Every label-free accuracy estimator, in the tables' order."""


def lookup(name: str) -> AccuracyEstimator:
  """The entry of ``name``, or a one-line ValueError listing the registered names."""
  entry = ESTIMATORS.get(name) if isinstance(name, str) else None
  if entry is None:
    raise ValueError(f"method: expected one of {', '.join(ESTIMATORS)}, got {name!r}")
  return entry


def predicted_accuracy(name: str, ref: Reference, views: Views) -> float:
  """The accuracy estimator ``name`` predicts for the inputs ``views`` describes."""
  return float(np.clip(np.mean(lookup(name).per_example(ref, views)), 0.0, 1.0))


# The estimators under the evaluation protocol: each split's clean calibration part.


class Estimate(NamedTuple):
  """One estimator's predictions of one set's accuracy.

  Attributes:
    estimator: a name of ``ESTIMATORS``.
    score: the score it reads (``confidence_name(k)`` for the confidence alone).
    target: the set's key.
    predicted: [F] its predicted accuracy, fitted on each split's calibration part.
    accuracy: [F] the true accuracy of what it predicted (a shifted set's test part of
      each split; 0 for inputs from outside the label set, which no label fits).
  """

  estimator: str
  score: str
  target: Hashable
  predicted: np.ndarray
  accuracy: np.ndarray


def confidence_name(k: int) -> str:
  """The name of the model's own P(Top-k correct): ``pmax``, or ``top<k>_mass``."""
  return "pmax" if k == 1 else f"top{k}_mass"


def estimate(
  clean: protocol.Inputs,
  splits: Splits,
  *,
  scores: Sequence[str],
  shifted: Mapping[Hashable, protocol.Inputs] | Sequence[protocol.Inputs] = (),
  ood: Mapping[Hashable, protocol.Inputs] | Sequence[protocol.Inputs] = (),
  n_bins: int = 20,
  k: int = 1,
  log_probs_score: str = "neg_log_pmax",
) -> list[Estimate]:
  """Every estimator's predicted accuracy of each shifted and OOD set, beside the truth.

  Per split f, everything is fitted on clean's calibration part: the model's confidence
  (``raw``) and the bins of each score (``n_bins``, the paper's) by ``protocol.fit_predict``,
  ATC's thresholds and DoC's offset. A shifted set (the same N examples, labelled) is
  predicted on its test part; an OOD set (labels ignored) on all its inputs.

  Args:
    clean: N labelled clean examples.
    splits: ``crossval.make_splits(N, ...)``.
    scores: the scores of ``calibrated`` and ``atc`` (``clean`` and every set hold them).
    shifted, ood: the sets, by key or in a sequence (keys 0, 1, ...: give disjoint keys).
    n_bins: the bins' count, in [1, the smallest calibration part].
    k: the event "the true label is among the k top classes".
    log_probs_score: a score the sets hold, for the confidence's method (any will do).

  Returns:
    One ``Estimate`` per (estimator, score, set): estimators in order, then scores, then
    the shifted sets, then the OOD sets.
  """
  scores = tuple(dict.fromkeys(scores))
  confidence_method = protocol.method("raw", log_probs_score, {})
  bins = {s: protocol.method("bins", s, {"n_bins": n_bins}) for s in scores}
  clean_data, k = protocol.checked_clean(clean, splits, [confidence_method, *bins.values()], k)
  protocol.bin_counts(n_bins, splits)
  needed = {log_probs_score, *scores}
  sets = [(key, data, True) for key, data in _sets("shifted", shifted, needed, k, clean_data)]
  sets += [(key, data, False) for key, data in _sets("ood", ood, needed, k, clean_data, False)]
  names = [(e.name, s) for e in ESTIMATORS.values() for s in (scores if e.on_score else (None,))]
  predicted = np.empty((len(names), len(sets), splits.num_splits))
  accuracy = np.zeros((len(sets), splits.num_splits))
  for f in range(splits.num_splits):
    cal = ~splits.test_mask(f)
    rows = [~cal if labelled else slice(None) for _, _, labelled in sets]
    datas = [data for _, data, _ in sets]
    sizes = [len(data.log_probs[r]) for data, r in zip(datas, rows, strict=True)]
    parts = [slice(end - n, end) for end, n in zip(np.cumsum(sizes), sizes, strict=True)]

    def fitted(method, datas=datas, rows=rows, cal=cal):
      target = _stacked(datas, rows, method, k)
      return protocol.fit_predict(method, clean_data, cal, target, (n_bins,))

    confidence, p_correct = fitted(confidence_method), {s: fitted(m) for s, m in bins.items()}
    own = fitted(confidence_method, [clean_data], [cal])
    ref = reference(clean_data.correct[cal], own, {s: clean_data.scores[s][cal] for s in scores})
    for s, ((_, data, labelled), part) in enumerate(zip(sets, parts, strict=True)):
      if labelled:
        accuracy[s, f] = np.mean(data.correct[rows[s]])
      for e, (name, score) in enumerate(names):
        views = Views(confidence[part])
        if score is not None:
          u = data.scores[score][rows[s]]
          views = Views(confidence[part], score, u, p_correct[score][part])
        predicted[e, s, f] = predicted_accuracy(name, ref, views)
  return [
    Estimate(name, score or confidence_name(k), key, predicted[e, s], accuracy[s])
    for e, (name, score) in enumerate(names)
    for s, (key, _, _) in enumerate(sets)
  ]


def _sets(name, sets, needed, k, clean, labelled=True) -> list:
  """``protocol.checked_sets``, or none where ``sets`` is empty."""
  if isinstance(sets, (Mapping, Sequence)) and not isinstance(sets, str) and not len(sets):
    return []
  return protocol.checked_sets(name, sets, needed, k, clean, labelled)


def _stacked(datas, rows, method: protocol.Method, k: int) -> base.Evidence:
  """What ``method`` predicts: every set's rows, one after another."""
  u = np.concatenate([data.scores[method.score][r] for data, r in zip(datas, rows, strict=True)])
  if method.entry.scores_only:
    return base.Evidence(u, k=k)
  log_probs = np.concatenate([data.log_probs[r] for data, r in zip(datas, rows, strict=True)])
  return base.Evidence(u, log_probs=log_probs, k=k)
