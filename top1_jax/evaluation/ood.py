"""How each score and calibrated method sees inputs from outside the label set."""

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import metrics
from top1_jax.core import scores as score_registry
from top1_jax.core.splits import Splits
from top1_jax.evaluation import protocol

SUMMARY = ("mean", "quantile_0.1", "quantile_0.5", "quantile_0.9")
SUMMARY += ("fraction_at_least_0.5", "fraction_at_least_0.9")
"""The keys of ``probability_summary``."""


class OODResult(NamedTuple):
  """One method's view of one out-of-distribution set.

  Attributes:
    ood: the key of the OOD set (its index when ``ood`` is a sequence).
    auroc: AUROC of all N clean inputs versus the OOD set (positive) by the score U
      alone, uncertain meaning out; the same for every method of a score.
    auroc_prob: [F] AUROC of each split's clean test part versus the OOD set by the
      method's 1 - P(correct).
    ood_prob: [F, N_ood] P(correct) of every OOD input by each split's fit.
    clean_prob: [sum_f T_f] P(correct) of the clean test parts, split after split.
    ood_summary, clean_summary: ``probability_summary`` of ``ood_prob``, ``clean_prob``.
  """

  score: str
  estimator: str
  ood: Hashable
  auroc: float
  auroc_prob: np.ndarray
  ood_prob: np.ndarray
  clean_prob: np.ndarray
  ood_summary: dict[str, float]
  clean_summary: dict[str, float]


def probability_summary(p: ArrayLike) -> dict[str, float]:
  """``SUMMARY`` of predicted probabilities ``p`` (any shape, not empty): their mean,
  quantiles (linear interpolation) and fractions at least 0.5 and 0.9."""
  p = np.asarray(p, np.float64).reshape(-1)
  if p.size == 0:
    raise ValueError("p: expected at least one probability, got none")
  q10, q50, q90 = np.quantile(p, (0.1, 0.5, 0.9))
  values = (p.mean(), q10, q50, q90, np.mean(p >= 0.5), np.mean(p >= 0.9))
  return {key: float(value) for key, value in zip(SUMMARY, values, strict=True)}


def _separation(in_values: np.ndarray, out_values: np.ndarray) -> float:
  is_out = np.concatenate([np.zeros(in_values.shape[0], bool), np.ones(out_values.shape[0], bool)])
  return metrics.auroc(np.concatenate([in_values, out_values]), is_out)


def ood_report(
  clean: protocol.Inputs,
  ood: Mapping[Hashable, protocol.Inputs] | Sequence[protocol.Inputs],
  splits: Splits,
  *,
  scores: Sequence[str],
  estimators: Sequence[str],
  k: int = 1,
  log_probs_score: str | None = None,
  options: Mapping[str, Mapping[str, Any]] | None = None,
  n_bins: int | None = None,
) -> list[OODResult]:
  """One ``OODResult`` per (method, score, OOD set): methods in order, then sets.

  Per split, each method fitted on the clean calibration part predicts P(correct) of the
  OOD inputs and of the clean test part. ``ood``: the OOD sets (labels ignored), by key or
  in a sequence. ``scores``, ``estimators``, ``log_probs_score``, ``options``: as
  ``protocol.methods``. ``n_bins``: the bin count of an estimator with one (None: default).
  """
  chosen = protocol.methods(estimators, scores, log_probs_score, options, n_bins)
  clean_host, k = protocol.checked_clean(clean, splits, chosen, k)
  protocol.bin_counts(n_bins or 1, splits)  # every split has calibration and test examples
  needed = {m.score for m in chosen}
  sets = protocol.checked_sets("ood", ood, needed, k, clean_host, labelled=False)
  methods = [method._replace(per_bin_count=False) for method in chosen]
  masks = [splits.test_mask(f) for f in range(splits.num_splits)]
  hosts = [host for _, host in sets]
  by_score = {}  # nothing fitted: one AUROC per score and set, by U (uncertain meaning out)
  for score in dict.fromkeys(method.score for method in methods):
    # an unknown stored score is an uncertainty, as the predictions files' are
    sign = -1.0 if getattr(score_registry.lookup(score), "confident_when_high", False) else 1.0
    u = [sign * data.scores[score] for data in (clean_host, *hosts)]
    by_score[score] = [_separation(u[0], out) for out in u[1:]]
  datas, whole = [clean_host, *hosts], [slice(None)] * len(hosts)
  results = []
  for method in methods:
    # per split: one fit predicting its clean test part and every OOD set
    fits = [protocol.fit_predict_sets(method, clean_host, ~t, datas, [t, *whole], k) for t in masks]
    clean_prob, *per_set = zip(*fits, strict=True)
    ood_prob = [np.stack(p) for p in per_set]  # [O] arrays [F, N_o]
    pooled = np.concatenate(clean_prob)
    for o, (key, _) in enumerate(sets):
      auroc_prob = [_separation(1 - c, 1 - p) for c, p in zip(clean_prob, ood_prob[o], strict=True)]
      results.append(OODResult(
        method.score, method.estimator, key, by_score[method.score][o], np.asarray(auroc_prob),
        ood_prob[o], pooled, probability_summary(ood_prob[o]), probability_summary(pooled),
      ))  # fmt: skip
  return results
