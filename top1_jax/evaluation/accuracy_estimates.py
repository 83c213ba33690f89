"""What accuracy to expect on unlabelled inputs: estimators fitted on clean labelled data.

Each predicts a set's accuracy as the mean of a per-example value, clipped to [0, 1].
"""

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import scores as score_registry
from top1_jax.core.splits import Splits
from top1_jax.evaluation import protocol


class Threshold(NamedTuple):
  """ATC's threshold t (``value``) on a score oriented so that high means confident, and
  ``tie_weight``, the share of a score equal to t counted as above it."""

  value: float
  tie_weight: float


class Reference(NamedTuple):
  """What clean labelled data tells the estimators: its accuracy, its mean confidence (the
  model's own P(correct)) and ATC's ``Threshold`` per score name."""

  accuracy: float
  confidence: float
  thresholds: Mapping[str, Threshold]


class Views(NamedTuple):
  """What an estimator reads of M unlabelled inputs, each [M]: the model's own P(correct),
  and a score's values and calibrated P(correct) (None without a score)."""

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
  """ATC's threshold: the clean scores above t (ties at t weighted, so that a tied score still
  gives the clean accuracy back) are as many as the hits. ``confidence``: [N], ``oriented``.
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
  confidence = float(np.mean(np.asarray(confidence, np.float64)))
  return Reference(float(np.mean(correct)), confidence, thresholds)


@dataclasses.dataclass(frozen=True)
class AccuracyEstimator:
  """A label-free estimator of accuracy: one estimate per score if ``on_score`` (else of the
  confidence alone), the mean of ``per_example(reference, views) -> [M]``."""

  name: str
  title: str
  on_score: bool
  per_example: Callable[[Reference, Views], np.ndarray]


ESTIMATORS: dict[str, AccuracyEstimator] = {
  e.name: e
  for e in (
    AccuracyEstimator("average_confidence", "average confidence", False, lambda r, v: v.confidence),
    AccuracyEstimator("doc", "DoC", False, lambda r, v: v.confidence + (r.accuracy - r.confidence)),
    AccuracyEstimator("calibrated", "the paper's bins", True, lambda r, v: v.p_correct),
    AccuracyEstimator(
      "atc", "ATC", True, lambda ref, v: above(ref.thresholds[v.score], oriented(v.score, v.u))
    ),
  )
}
"""Every label-free accuracy estimator, in the tables' order: the model's own confidence;
DoC (Guillory et al. 2021), the confidence shifted by the clean accuracy minus the clean
confidence; the paper's calibrated P(correct) of the clean bins of a score; ATC (Garg et
al. 2022), the fraction of inputs above the clean threshold of a score."""


def lookup(name: str) -> AccuracyEstimator:
  """The entry of ``name``, or a one-line ValueError listing the registered names."""
  entry = ESTIMATORS.get(name) if isinstance(name, str) else None
  if entry is None:
    raise ValueError(f"method: expected one of {', '.join(ESTIMATORS)}, got {name!r}")
  return entry


def predicted_accuracy(name: str, ref: Reference, views: Views) -> float:
  """The accuracy estimator ``name`` predicts for the inputs ``views`` describes."""
  return float(np.clip(np.mean(lookup(name).per_example(ref, views)), 0.0, 1.0))


class Estimate(NamedTuple):
  """One estimator's predictions of one set's (``target``'s) accuracy, per split: ``predicted``
  [F] and the truth ``accuracy`` [F] (0 for OOD inputs); ``score`` is ``pmax`` or
  ``top<k>_mass`` for an estimator of the confidence alone."""

  estimator: str
  score: str
  target: Hashable
  predicted: np.ndarray
  accuracy: np.ndarray


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

  A shifted set (the same N examples, labelled) is predicted on each split's test part; an
  OOD set (labels ignored) on all its inputs. ``scores``: of ``calibrated`` and ``atc``.
  ``shifted``, ``ood``: by key or in a sequence (give disjoint keys). Returns one
  ``Estimate`` per (estimator, score, set), shifted sets before OOD sets.
  """
  scores = tuple(dict.fromkeys(scores))
  confidence_method = protocol.method("raw", log_probs_score, {})
  bins = {s: protocol.method("bins", s, {"n_bins": n_bins}) for s in scores}
  clean_data, k = protocol.checked_clean(clean, splits, [confidence_method, *bins.values()], k)
  protocol.bin_counts(n_bins, splits)
  needed = {log_probs_score, *scores}
  sets = [
    (key, data, labelled)
    for name, given, labelled in (("shifted", shifted, True), ("ood", ood, False))
    for key, data in protocol.checked_sets(name, given, needed, k, clean_data, labelled, True)
  ]
  names = [(e.name, s) for e in ESTIMATORS.values() for s in (scores if e.on_score else (None,))]
  predicted = np.empty((len(names), len(sets), splits.num_splits))
  accuracy = np.zeros((len(sets), splits.num_splits))
  datas = [data for _, data, _ in sets]
  for f in range(splits.num_splits):
    cal = ~splits.test_mask(f)
    rows = [~cal if labelled else slice(None) for _, _, labelled in sets]

    def fitted(method, datas=datas, rows=rows, cal=cal):
      return protocol.fit_predict_sets(method, clean_data, cal, datas, rows, k)

    confidence, p_correct = fitted(confidence_method), {s: fitted(m) for s, m in bins.items()}
    (own,) = fitted(confidence_method, [clean_data], [cal])
    ref = reference(clean_data.correct[cal], own, {s: clean_data.scores[s][cal] for s in scores})
    for s, (_, data, labelled) in enumerate(sets):
      if labelled:
        accuracy[s, f] = np.mean(data.correct[rows[s]])
      for e, (name, score) in enumerate(names):
        on = () if score is None else (score, data.scores[score][rows[s]], p_correct[score][s])
        predicted[e, s, f] = predicted_accuracy(name, ref, Views(confidence[s], *on))
  own_confidence = "pmax" if k == 1 else f"top{k}_mass"
  return [
    Estimate(name, score or own_confidence, key, predicted[e, s], accuracy[s])
    for e, (name, score) in enumerate(names)
    for s, (key, _, _) in enumerate(sets)
  ]
