"""Calibrate in distribution, test under shift (Ovadia, Snoek et al. 2019): the second protocol.

Beside cross-validation within one file (``crossval.cross_validate``): each method is
fitted once per split on the **clean** calibration part (``~splits.test_mask(f)``) and
applied unchanged to the test part of **every** shifted set, the same N examples
transformed, so every intensity tests the same examples.

* ``evaluate_shifts``: ``crossval.METRICS`` of every (score, method) on every shifted
  set, by the steps of ``cross_validate``'s fit/predict loop (``crossval.held_out_bins``,
  ``binned_predictions``, ``split_metrics``): on the clean set, ``cross_validate``'s rows.
* ``ood_report``: how well each score tells inputs from outside the label set from the
  clean ones (AUROC), and the P(correct) each calibrated method gives them.

The methods: the registered estimators (``estimators.registry``) and ``"raw"``, the
model's own Top-k mass as P(correct), nothing fitted (Ovadia et al.'s "Vanilla"; of
MC-dropout or ensemble log-probabilities, their "Dropout" and "Ensemble").
"""

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import events, metrics, validation
from top1_jax.core import scores as score_registry
from top1_jax.estimators import base, registry
from top1_jax.evaluation import crossval

__all__ = [
  "RAW",
  "SUMMARY",
  "Inputs",
  "OODResult",
  "ShiftResult",
  "evaluate_shifts",
  "method_names",
  "ood_report",
  "probability_summary",
]


class Inputs(NamedTuple):
  """One set of N examples as the protocols take it (``sweep.runner.Source`` holds these).

  Attributes:
    log_probs: [N, K] float, the model's log-probabilities (for MC dropout and
      ensembles the log of the mean probabilities); logits also do.
    labels: [N] int in [0, K), or None where there are none (out-of-distribution
      inputs; the clean and shifted sets need them).
    scores: score name -> [N] float, the uncertainty scores U (``Source.scores``).
  """

  log_probs: ArrayLike
  labels: ArrayLike | None
  scores: Mapping[str, ArrayLike]


class ShiftResult(NamedTuple):
  """One method's metrics on one shifted set.

  Attributes:
    score: the score U the method was fitted on, or (methods on the log-probabilities)
      binned by for the binned metrics: ``log_probs_score``.
    estimator: the method's name ("raw" or a registered estimator).
    shift: the key of the shifted set (its index when ``shifted`` is a sequence).
    metrics: ``crossval.CrossValidation`` of ``crossval.METRICS`` over the splits, for
      each bin count (``rows()`` for the tables).
  """

  score: str
  estimator: str
  shift: Hashable
  metrics: crossval.CrossValidation


SUMMARY = ("mean", "quantile_0.1", "quantile_0.5", "quantile_0.9")
SUMMARY += ("fraction_at_least_0.5", "fraction_at_least_0.9")
"""The keys of ``probability_summary``."""


class OODResult(NamedTuple):
  """One method's view of one out-of-distribution set.

  Attributes:
    score: as ``ShiftResult.score``.
    estimator: the method's name.
    ood: the key of the OOD set (its index when ``ood`` is a sequence).
    auroc: AUROC of in- (all N clean inputs) versus out-of-distribution (positive) by
      the score U alone, uncertain meaning out (``ood_report``).
    auroc_prob: [F] AUROC of each split's clean test part versus the OOD set by the
      method's 1 - P(correct).
    ood_prob: [F, N_ood] P(correct) of every OOD input by each split's fit.
    clean_prob: [sum_f T_f] P(correct) of the clean test parts, split 0's test examples
      (in index order) first, for comparison.
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


def _raw_predict(_, evidence: base.Evidence) -> np.ndarray:
  name = score_registry.topk_name(evidence.k)
  return np.exp(-np.asarray(score_registry.compute_one(name, evidence.log_probs), np.float64))


RAW = base.Estimator(
  "raw", "log_probs", lambda evidence: None, _raw_predict, lambda state: {}, lambda d, src: None
)
"""The model's Top-k mass as P(correct), nothing fitted: a method of the protocols, not a
calibrator (``Calibrator`` has nothing to save for it)."""


def method_names() -> tuple[str, ...]:
  """Every method the protocols run: "raw", then the registered estimators."""
  return (RAW.name, *registry.REGISTRY)


def _lookup(name) -> base.Estimator:
  entry = {RAW.name: RAW, **registry.REGISTRY}.get(name) if isinstance(name, str) else None
  if entry is None:
    raise ValueError(f"estimators: expected names among {', '.join(method_names())}, got {name!r}")
  return entry


class _Method(NamedTuple):
  name: str
  entry: base.Estimator
  score: str  # the U it is fitted on, or binned by
  options: dict[str, Any]
  per_bin_count: bool  # fitted at each reported bin count (the bins)


class _Host(NamedTuple):
  """One checked set on the host: log_probs [N, K], correct [N] bool (None without
  labels), labels [N] int32 or None, scores name -> [N]."""

  log_probs: np.ndarray
  correct: np.ndarray | None
  labels: np.ndarray | None
  scores: dict[str, np.ndarray]


def _names(name: str, value, what: str) -> tuple[str, ...]:
  if isinstance(value, str) or not isinstance(value, Sequence):
    raise ValueError(f"{name}: expected a sequence of {what} names, got {value!r}")
  return tuple(dict.fromkeys(value))


def _methods(estimators, score_names, log_probs_score, options, bin_count) -> list[_Method]:
  """The (score, method) pairs, in the order of ``estimators`` then ``scores``."""
  entries = [_lookup(name) for name in _names("estimators", estimators, "estimator")]
  if not entries:
    raise ValueError("estimators: expected at least one method, got none")
  options = {} if options is None else options
  known = {entry.name for entry in entries}
  unknown = sorted(set(options) - known, key=str) if isinstance(options, Mapping) else []
  if not isinstance(options, Mapping) or unknown:
    got = f"{unknown[0]!r}, not among the estimators" if unknown else repr(options)
    raise ValueError(f"options: expected a mapping of method name -> its options, got {got}")
  if any(entry.scores_only for entry in entries) and not score_names:
    raise ValueError("scores: expected at least one score name for the estimators on U, got none")
  if not all(entry.scores_only for entry in entries) and not isinstance(log_probs_score, str):
    needs = next(entry.name for entry in entries if not entry.scores_only)
    raise ValueError(f"log_probs_score: {needs!r} needs a score to bin by, got {log_probs_score!r}")
  methods = []
  for entry in entries:
    given = entry.check_options(options.get(entry.name, {}))
    for score in score_names if entry.scores_only else (log_probs_score,):
      known = score_registry.lookup(score)
      fit_options = dict(given)
      if "increasing" in entry.options and "increasing" not in given:
        fit_options["increasing"] = known is not None and known.confident_when_high
      per_bin_count = "n_bins" in entry.options and "n_bins" not in given
      if per_bin_count and bin_count is not None:
        fit_options["n_bins"], per_bin_count = bin_count, False
      methods.append(_Method(entry.name, entry, score, fit_options, per_bin_count))
  return methods


def _host(name: str, inputs, needed: set[str], k: int, num_classes: int | None, labelled: bool):
  """``inputs`` checked on the host, with the Top-k events where it has labels."""
  validation.instance(name, inputs, Inputs, "shift.Inputs(log_probs, labels, scores)")
  log_probs = validation.float_array(f"{name}.log_probs", inputs.log_probs, 2, host=True)
  validation.check_nonempty(f"{name}.log_probs", log_probs)
  if num_classes is not None and log_probs.shape[1] != num_classes:
    raise ValueError(
      f"{name}.log_probs: expected {num_classes} classes like clean, got shape {log_probs.shape}"
    )
  validation.refuse_probabilities(
    f"{name}.log_probs", log_probs, "pass their log (Inputs holds log-probabilities)"
  )
  if not isinstance(inputs.scores, Mapping):
    raise ValueError(f"{name}.scores: expected a mapping name -> [N] scores, got {inputs.scores!r}")
  missing = sorted(needed - set(inputs.scores))
  if missing:
    have = ", ".join(sorted(inputs.scores)) or "none"
    raise ValueError(f"{name}.scores: no score {missing[0]!r} (it has: {have})")
  arrays = {f"{name}.log_probs": log_probs}
  for score in sorted(needed):
    arrays[f"{name}.scores[{score!r}]"] = validation.float_array(
      f"{name}.scores[{score!r}]", inputs.scores[score], 1, host=True
    )
  if labelled and inputs.labels is None:
    raise ValueError(f"{name}.labels: expected [{log_probs.shape[0]}] true labels, got None")
  if labelled:
    labels = validation.labels_array(f"{name}.labels", inputs.labels, log_probs.shape[1], host=True)
    arrays[f"{name}.labels"] = labels
  validation.same_length(**arrays)  # one line naming each array's length
  host_scores = {score: arrays[f"{name}.scores[{score!r}]"] for score in needed}
  if not labelled:
    return _Host(log_probs, None, None, host_scores)
  correct = np.asarray(events.topk_correct(log_probs, labels, k))
  return _Host(log_probs, correct, labels, host_scores)


def _sets(name: str, sets) -> list[tuple[Hashable, Any]]:
  """(key, inputs) of a mapping, or (index, inputs) of a sequence; at least one."""
  if isinstance(sets, Mapping):
    items = list(sets.items())
  elif isinstance(sets, Sequence) and not isinstance(sets, (str, Inputs)):
    items = list(enumerate(sets))
  else:
    items = []
  if not items or not isinstance(sets, (Mapping, Sequence)):
    raise ValueError(f"{name}: expected a mapping or sequence of shift.Inputs, got {sets!r:.80}")
  return items


def _checked(clean, others, splits, estimators, score_names, k, log_probs_score, options, **kw):
  """Every argument checked once: (methods, clean, [(key, other)], k)."""
  score_names = _names("scores", score_names, "score")
  methods = _methods(estimators, score_names, log_probs_score, options, kw["bin_count"])
  needed = {method.score for method in methods}
  validation.instance("splits", splits, crossval.Splits, "crossval.Splits from make_splits")
  k = validation.positive_int("k", k)
  clean_host = _host("clean", clean, needed, k, None, labelled=True)
  num, num_classes = clean_host.log_probs.shape
  validation.positive_int("k", k, maximum=num_classes)
  if splits.fold.shape[-1] != num:
    raise ValueError(f"splits: made for {splits.fold.shape[-1]} examples, clean has {num}")
  checked = []
  for key, inputs in _sets(kw["name"], others):
    name = f"{kw['name']}[{key!r}]"
    host = _host(name, inputs, needed, k, num_classes, labelled=kw["labelled"])
    if kw["labelled"] and host.log_probs.shape[0] != num:
      raise ValueError(
        f"{name}.log_probs: expected clean's {num} examples, got {len(host.log_probs)}"
      )
    checked.append((key, host))
  return methods, clean_host, checked, k


def _predictions(method: _Method, clean: _Host, cal: np.ndarray, target: base.Evidence, n_bins):
  """The method fitted on the clean calibration part, predicting ``target``: [M] (or
  [B, M] for a method fitted at each of ``n_bins``), float64 on the host."""
  u = clean.scores[method.score]
  evidence = base.Evidence(u[cal], clean.correct[cal])
  if not method.entry.scores_only:
    evidence = evidence._replace(
      log_probs=clean.log_probs[cal], k=target.k, labels=clean.labels[cal]
    )
  entry = method.entry
  if not method.per_bin_count:
    return np.asarray(entry.predict(entry.fit(evidence, **method.options), target), np.float64)
  fits = [entry.fit(evidence, **method.options, n_bins=n) for n in n_bins]
  return np.stack([np.asarray(entry.predict(state, target), np.float64) for state in fits])


def evaluate_shifts(
  clean: Inputs,
  shifted: Mapping[Hashable, Inputs] | Sequence[Inputs],
  splits: crossval.Splits,
  *,
  scores: Sequence[str],
  estimators: Sequence[str],
  n_bins: int | Sequence[int] = (10, 20, 100),
  k: int = 1,
  log_probs_score: str | None = None,
  options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[ShiftResult]:
  """``crossval.METRICS`` of each method calibrated on clean data, on every shifted set.

  For every (score, method) and split f, the method is fitted once on the clean
  calibration part (``~splits.test_mask(f)``) and predicts the test parts of all shifted
  sets in one call. The metrics are ``cross_validate``'s, by the same code: Brier and
  NLL are per-example means of the test predictions; ECE, EOR, AUROC and the
  decompositions use the equal-count bins of U fitted on the clean calibration part,
  each set's test counts and hits per bin and the mean test prediction per bin. A
  shifted set equal to ``clean`` gives ``cross_validate(u, correct, splits=splits,
  estimator=e)``'s rows.

  * Methods on the scores U alone (bins, isotonic, kde) are fitted on each score of
    ``scores`` and binned by it; ``increasing`` (isotonic) follows the score's direction
    in ``core.scores``, as in the sweep; an estimator with an ``n_bins`` option (the
    bins) is fitted at each reported bin count (its row at n bins is the paper's n
    bins) unless ``options`` sets ``n_bins``.
  * Methods on the log-probabilities ("raw", temperature, toplabel) are fitted on the
    clean calibration part's log-probabilities, events and (temperature) labels, and
    binned for the binned metrics by the score ``log_probs_score`` (e.g.
    "neg_log_pmax"), which every set must hold; their results carry it as ``score``.

  Args:
    clean: the in-distribution set of N examples, with labels: calibration data.
    shifted: the test sets, each the same N examples transformed (with labels), by
      key (the results' ``shift``) or in a sequence (keys 0, 1, ...). Include
      ``clean`` itself for the unshifted rows.
    splits: ``crossval.make_splits(N, ...)``.
    scores: names of the scores U the estimators on U are fitted on (``Inputs.scores``
      keys; for the Top-k event pass ``core.scores.for_event(name, k)``).
    estimators: method names: "raw" and ``estimators.registry`` names.
    n_bins: the bin counts of the binned metrics, each in [1, the smallest
      calibration part].
    k: the event "the true label is among the k top classes".
    log_probs_score: the score that bins the methods on the log-probabilities;
      required when ``estimators`` holds one.
    options: method name -> options of its ``fit`` (e.g. {"kde": {"bandwidth": 0.1}}).

  Returns:
    One ``ShiftResult`` per (method, score, shifted set): methods in ``estimators``'
    order, each method's scores in ``scores``' order, sets in ``shifted``'s order.
  """
  methods, clean_host, sets, k = _checked(
    clean, shifted, splits, estimators, scores, k, log_probs_score, options,
    name="shifted", labelled=True, bin_count=None,
  )  # fmt: skip
  n_bins = crossval.checked_bin_counts(n_bins, splits)
  correct = np.stack([host.correct for _, host in sets])  # [S, N]
  per_fold = [None] * len(methods)
  for score in dict.fromkeys(method.score for method in methods):
    group = [i for i, method in enumerate(methods) if method.score == score]
    hosts = [host for _, host in sets]
    per_split = _shifted_sums(
      [methods[i] for i in group], clean_host, hosts, correct, splits, n_bins, k
    )
    for i, sums in zip(group, per_split, strict=True):
      per_fold[i] = _per_set(crossval.split_metrics(sums), n_bins)
  return [
    ShiftResult(method.score, method.name, key, per_fold[i][s])
    for i, method in enumerate(methods)
    for s, (key, _) in enumerate(sets)
  ]


def _per_set(per_fold: dict[str, np.ndarray], n_bins) -> list[crossval.CrossValidation]:
  """Each set's ``CrossValidation`` of metrics [S, B, F], the statistics of all at once."""
  num_sets = next(iter(per_fold.values())).shape[0]
  flat = {name: value.reshape(-1, value.shape[-1]) for name, value in per_fold.items()}
  stats = crossval.CrossValidation.from_per_fold(range(num_sets * len(n_bins)), flat)[1:]
  stats = [{name: v.reshape(num_sets, -1, *v.shape[1:]) for name, v in d.items()} for d in stats]
  return [
    crossval.CrossValidation(n_bins, *({name: v[s] for name, v in d.items()} for d in stats))
    for s in range(num_sets)
  ]


def _shifted_sums(group, clean: _Host, sets: list[_Host], correct, splits, n_bins, k) -> list:
  """Each method's ``crossval.BinnedPredictions`` of every split, for the methods of one score."""
  score = group[0].score
  u = np.stack([host.scores[score] for host in sets])  # [S, N]
  log_probs = None
  if not all(method.entry.scores_only for method in group):
    log_probs = np.stack([host.log_probs for host in sets])  # [S, N, K]
  per_split = [[] for _ in group]
  for split in range(splits.num_splits):
    test = splits.test_mask(split)
    cal = ~test
    u_cal, correct_cal = clean.scores[score][cal], clean.correct[cal]
    binned = crossval.held_out_bins(u_cal, correct_cal, u[:, test], correct[:, test], n_bins)
    target = base.Evidence(u[:, test].reshape(-1), k=k)
    if log_probs is not None:
      target = target._replace(log_probs=log_probs[:, test].reshape(-1, log_probs.shape[-1]))
    for method, sums in zip(group, per_split, strict=True):
      sums.append(
        crossval.binned_predictions(binned, _predictions(method, clean, cal, target, n_bins))
      )
  return per_split


def probability_summary(p: ArrayLike) -> dict[str, float]:
  """``SUMMARY`` of predicted probabilities: their mean, 0.1 / 0.5 / 0.9 quantiles
  (linear interpolation) and the fractions at least 0.5 and at least 0.9.

  Args:
    p: [...] float in [0, 1], at least one value.
  """
  p = np.asarray(p, np.float64).reshape(-1)
  if p.size == 0:
    raise ValueError("p: expected at least one probability, got none")
  q10, q50, q90 = np.quantile(p, (0.1, 0.5, 0.9))
  values = (p.mean(), q10, q50, q90, np.mean(p >= 0.5), np.mean(p >= 0.9))
  return {key: float(value) for key, value in zip(SUMMARY, values, strict=True)}


def _score_auroc(score: str, clean: _Host, ood: _Host) -> float:
  """AUROC of ``ood`` (positive) against all of ``clean`` by U, uncertain meaning out (an
  unknown stored score is an uncertainty, as the predictions files' scores are)."""
  sign = -1.0 if getattr(score_registry.lookup(score), "confident_when_high", False) else 1.0
  return _separation(sign * clean.scores[score], sign * ood.scores[score])


def _separation(in_values: np.ndarray, out_values: np.ndarray) -> float:
  """AUROC of out (positive) against in, by values where larger means "out"."""
  is_out = np.concatenate([np.zeros(in_values.shape[0], bool), np.ones(out_values.shape[0], bool)])
  return metrics.auroc(np.concatenate([in_values, out_values]), is_out)


def ood_report(
  clean: Inputs,
  ood: Mapping[Hashable, Inputs] | Sequence[Inputs],
  splits: crossval.Splits,
  *,
  scores: Sequence[str],
  estimators: Sequence[str],
  k: int = 1,
  log_probs_score: str | None = None,
  options: Mapping[str, Mapping[str, Any]] | None = None,
  n_bins: int | None = None,
) -> list[OODResult]:
  """How each score and calibrated method sees inputs from outside the label set.

  * ``auroc``: in- versus out-of-distribution (positive) by the score U, uncertain
    meaning out. "In" is **all** N clean inputs: nothing is fitted, so none need be held
    out; the value is the same for every split and method of a score.
  * Per split f, the method fitted on the clean calibration part (as in
    ``evaluate_shifts``, but once: an estimator with an ``n_bins`` option takes
    ``n_bins``, or its own default when None, unless ``options`` sets it) predicts in
    one call P(correct) of every OOD input (``ood_prob``) and of the clean test part
    (``clean_prob``); ``auroc_prob`` [F] separates the two by 1 - P(correct).

  Args:
    clean: the in-distribution set of N examples, with labels.
    ood: the OOD sets (any number of examples each, labels ignored: None will do), by
      key (the results' ``ood``) or in a sequence; each holds the K classes'
      log-probabilities and the scores used.
    splits, scores, estimators, k, log_probs_score, options: as ``evaluate_shifts``.
    n_bins: the bins' bin count (see above), in [1, the smallest calibration part].

  Returns:
    One ``OODResult`` per (method, score, OOD set), in ``evaluate_shifts``' order.
  """
  methods, clean_host, sets, k = _checked(
    clean, ood, splits, estimators, scores, k, log_probs_score, options,
    name="ood", labelled=False, bin_count=n_bins,
  )  # fmt: skip
  if n_bins is not None:
    crossval.checked_bin_counts(n_bins, splits)
  methods = [method._replace(per_bin_count=False) for method in methods]
  masks = [splits.test_mask(f) for f in range(splits.num_splits)]
  if not all(mask.any() and not mask.all() for mask in masks):
    raise ValueError("splits: every split needs calibration and test examples")
  hosts = [host for _, host in sets]
  by_score = {  # nothing fitted: one AUROC per score and set
    score: [_score_auroc(score, clean_host, host) for host in hosts]
    for score in dict.fromkeys(method.score for method in methods)
  }
  results = []
  for method in methods:
    ood_prob, clean_prob = _ood_predictions(method, clean_host, hosts, masks, k)
    pooled = np.concatenate(clean_prob)
    for o, (key, _) in enumerate(sets):
      auroc_prob = [_separation(1 - c, 1 - p) for c, p in zip(clean_prob, ood_prob[o], strict=True)]
      results.append(OODResult(
        method.score, method.name, key, by_score[method.score][o], np.asarray(auroc_prob),
        ood_prob[o], pooled, probability_summary(ood_prob[o]), probability_summary(pooled),
      ))  # fmt: skip
  return results


def _ood_predictions(method: _Method, clean: _Host, sets: list[_Host], masks, k: int):
  """([O] arrays [F, N_o] of the OOD sets' P(correct), [F] arrays [T_f] of the clean test
  parts'): per split one fit and one prediction of the test part and every OOD set."""
  needs_log_probs = not method.entry.scores_only
  u_sets = [host.scores[method.score] for host in sets]
  lp_sets = [host.log_probs for host in sets] if needs_log_probs else []
  sizes = np.cumsum([0] + [u.shape[0] for u in u_sets])
  ood_prob = [np.empty((len(masks), u.shape[0])) for u in u_sets]
  clean_prob = []
  for split, test in enumerate(masks):
    target = base.Evidence(np.concatenate([clean.scores[method.score][test], *u_sets]), k=k)
    if needs_log_probs:
      target = target._replace(log_probs=np.concatenate([clean.log_probs[test], *lp_sets]))
    p = _predictions(method, clean, ~test, target, None)
    num_test = int(np.count_nonzero(test))
    clean_prob.append(p[:num_test])
    for o, probs in enumerate(ood_prob):
      probs[split] = p[num_test + sizes[o] : num_test + sizes[o + 1]]
  return ood_prob, clean_prob
