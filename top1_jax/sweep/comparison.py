"""The paper's Table 1: the benchmark's metrics of a classifier, on the Top-1 splits.

For one classifier's log-probabilities, each variant below is scored on the test
part of every split (the same splits the Top-1 bins are cross-validated on) and
the metrics are averaged over splits:

* ``"raw"``: the classifier's softmax as it is;
* ``"temperature"`` (single models): softmax(log_probs / T) with T fitted on each
  calibration part (``temperature.fit_splits``: every split from one pass of cumulants);
* ``"toplabel"`` (single models): top-label histogram binning of pmax (``toplabel``,
  Gupta & Ramdas, as their reference code): per predicted class,
  floor(n_c / points_per_bin) equal-mass bins fitted on each calibration part, a class
  predicted fewer than ``points_per_bin`` times left at its raw pmax; it predicts
  P(correct) only.

Metrics of a variant (``baselines`` defines them): the multiclass Brier, the
confidence ECE (equal-width bins of pmax) and the binary Top-1 Brier of pmax used
directly as P(correct), the like-for-like baseline of Top-1 binning. The
predicted class is the argmax of the (scaled) log-probabilities, as in
``events.topk_correct``, so the Top-1 event is the one the bins are fitted to.
``table_row`` puts a variant beside the Top-1 bins' own Brier and ECE.
"""

from collections.abc import Mapping

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import equal_width, events, validation
from top1_jax.estimators import temperature, toplabel
from top1_jax.evaluation import crossval

VARIANTS = ("raw", "temperature", "toplabel")
"""Every variant ``baseline_rows`` scores, in its order (a model with samples: raw only)."""


def _split_means(masks, brier, pmax, correct, ece_bins) -> dict[str, np.ndarray]:
  """[F] means over each split's test part (``masks``: [F, N] bool) of its [F, N]
  ``brier`` and ``pmax`` (or [N], shared by all splits), float64 on the host.

  On the host with NumPy: a few passes over [N] vectors per split take about as
  long as a compiled program runs, and a first evaluate compiles one program less.
  """
  masks, correct = np.asarray(masks, bool), np.asarray(correct, bool)
  brier, pmax = (np.broadcast_to(np.asarray(x), masks.shape) for x in (brier, pmax))
  means = {"multiclass_brier": [], "confidence_ece": [], "raw_top1_brier": []}
  for test, brier_f, pmax_f in zip(masks, brier, pmax, strict=True):
    count = np.count_nonzero(test)
    confidence, gap = pmax_f[test], correct[test] - pmax_f[test].astype(np.float64)
    # Per bin: sum of hits - sum of confidences, from one weighted count.
    bin_gap = np.bincount(equal_width.equal_width_index(confidence, ece_bins), gap, ece_bins)
    means["multiclass_brier"].append(np.sum(brier_f[test], dtype=np.float64) / count)
    means["confidence_ece"].append(np.sum(np.abs(bin_gap)) / count)
    means["raw_top1_brier"].append(np.sum(np.square(gap)) / count)
  return {key: np.asarray(values) for key, values in means.items()}


def _toplabel_splits(pmax, predicted, correct, masks, num_classes, points_per_bin, ece_bins, brier):
  """Per split: top-label bins of pmax fitted on the calibration part, scored on the test."""
  model = toplabel.fit_splits(
    pmax, predicted, correct, ~masks, num_classes=num_classes, points_per_bin=points_per_bin
  )
  prob = toplabel.predict(model, pmax, predicted)  # [F, N]: every split's bins on every example
  # Its Brier and ECE are those of any P(correct) on the test part: the raw rows' means.
  means = _split_means(masks, brier, prob, correct, ece_bins)
  return {
    "toplabel_brier": means["raw_top1_brier"],
    "toplabel_ece": means["confidence_ece"],
    "toplabel_classes_with_own_bins": np.sum(np.asarray(model.own), axis=-1).astype(np.float64),
  }


def _mean_over_splits(per_split: Mapping) -> dict[str, float]:
  return {key: float(np.mean(np.asarray(values, np.float64))) for key, values in per_split.items()}


def _raw_terms(label_terms, num: int) -> tuple[np.ndarray, ...]:
  """The host top class, multiclass Brier and pmax of ``events.LabelTerms`` of N examples."""
  validation.instance("label_terms", label_terms, events.LabelTerms, "events.LabelTerms")
  terms = [np.asarray(x) for x in (label_terms.top_class, label_terms.multiclass_brier)]
  terms.append(np.asarray(label_terms.pmax))
  if any(x.shape != (num,) for x in terms):
    raise ValueError(f"label_terms: expected [{num}] arrays, got shapes {[x.shape for x in terms]}")
  return tuple(terms)


def _check(log_probs, labels, splits, points_per_bin, ece_bins):
  log_probs = validation.float_array("log_probs", log_probs, 2)
  if log_probs.shape[-1] < 2:
    raise ValueError(f"log_probs: expected at least 2 classes, got shape {log_probs.shape}")
  labels = validation.labels_array("labels", labels, log_probs.shape[-1])
  num = validation.same_length(log_probs=log_probs, labels=labels)
  validation.instance("splits", splits, crossval.Splits, "crossval.Splits from make_splits")
  if splits.fold.shape[-1] != num:
    raise ValueError(f"splits: made for {splits.fold.shape[-1]} examples, log_probs has {num}")
  masks = np.stack([np.asarray(splits.test_mask(f), bool) for f in range(splits.num_splits)])
  if not np.all(masks.any(axis=1)) or np.any(masks.all(axis=1)):
    raise ValueError("splits: every split needs calibration and test examples")
  points_per_bin = validation.positive_int("points_per_bin", points_per_bin)
  return log_probs, labels, masks, points_per_bin, validation.positive_int("ece_bins", ece_bins)


def baseline_rows(
  log_probs: ArrayLike,
  labels: ArrayLike,
  splits: crossval.Splits,
  *,
  single_model: bool,
  ece_bins: int = equal_width.DEFAULT_ECE_BINS,
  points_per_bin: int = toplabel.DEFAULT_POINTS_PER_BIN,
  label_terms: events.LabelTerms | None = None,
) -> list[dict[str, str | float]]:
  """The benchmark's metrics of each variant, mean over the splits' test parts.

  Args:
    log_probs: [N, K] float, the classifier's log-probabilities (or logits).
    labels: [N] int in [0, K).
    splits: ``crossval.make_splits(N, ...)``, the splits of the Top-1 sweep.
    single_model: one network (no MC samples, no ensemble): temperature scaling
      and top-label binning apply, and add their rows.
    ece_bins: equal-width bins of the confidence ECE (15 in the benchmark).
    points_per_bin: top-label binning's calibration examples per bin: class c gets
      floor(n_c / points_per_bin) bins (50, the reference's).
    label_terms: ``events.label_terms(log_probs, labels)`` when already computed
      (``sweep.Source`` has them from its scoring pass); None computes them.

  Returns:
    One dict per variant, in ``VARIANTS`` order ("raw" only unless
    ``single_model``), with ``variant`` and the means over splits of
    ``multiclass_brier``, ``confidence_ece``, ``raw_top1_brier`` (of the variant's
    own pmax) and ``temperature`` (1.0 but for "temperature", the mean fitted T).
    "toplabel" repeats the raw metrics (it leaves the softmax alone) and adds
    ``toplabel_brier``, ``toplabel_ece`` (equal-width, ``ece_bins``),
    ``toplabel_classes_with_own_bins`` (mean over splits of the classes predicted at
    least ``points_per_bin`` times in the calibration part; the others keep pmax),
    ``toplabel_num_classes`` (K) and ``toplabel_points_per_bin``.
  """
  log_probs, labels, masks, points_per_bin, ece_bins = _check(
    log_probs, labels, splits, points_per_bin, ece_bins
  )
  if label_terms is None:
    label_terms = events.label_terms(log_probs, labels)
  predicted, brier, pmax = _raw_terms(label_terms, masks.shape[-1])
  # The Top-1 event is the argmax's, the same for any T; the raw softmax's terms come
  # from one pass, then every split's means.
  correct = predicted == np.asarray(labels)
  raw = _mean_over_splits(_split_means(masks, brier, pmax, correct, ece_bins))
  rows = [{"variant": "raw", **raw, "temperature": 1.0}]
  if not single_model:
    return rows
  fits = temperature.fit_splits(log_probs, labels, (~masks).astype(log_probs.dtype))
  scaled = _split_means(masks, fits.multiclass_brier, fits.pmax, correct, ece_bins)
  scaled["temperature"] = np.asarray(fits.temperature)
  rows.append({"variant": "temperature", **_mean_over_splits(scaled)})
  num_classes = log_probs.shape[-1]
  host = (pmax, predicted, correct, masks, num_classes)
  binned = _mean_over_splits(_toplabel_splits(*host, points_per_bin, ece_bins, brier))
  binned.update(toplabel_num_classes=num_classes, toplabel_points_per_bin=points_per_bin)
  rows.append({**rows[0], "variant": "toplabel", **binned})
  return rows


def table_row(row: Mapping[str, str | float], top1_bins: Mapping[str, float | None]) -> dict:
  """A Table-1 row: a variant's benchmark metrics beside Top-1 binning's Brier and ECE.

  Temperature scaling keeps the order of pmax, so "raw" and "temperature" share the
  Top-1 bins of the classifier's score. Top-label binning is itself a binning of
  pmax: its own Brier and ECE fill the binned cells, and as it predicts P(correct)
  only, it has no multiclass Brier (None).

  Args:
    row: one of ``baseline_rows``.
    top1_bins: the Top-1 bins' cross-validated means at ``compare_bins`` bins,
      with keys "brier" and "ece" (a row of ``crossval.CrossValidation.rows()``).

  Returns:
    ``row`` with ``top1_estimator`` ("bins" or "toplabel"), ``top1_binned_brier``
    and ``top1_binned_ece``; for "toplabel" without ``toplabel_brier`` /
    ``toplabel_ece`` (moved to the binned cells) and ``multiclass_brier`` None.
  """
  row = dict(row)
  variant = row.get("variant")
  if variant not in VARIANTS:
    raise ValueError(f"row: expected a variant among {VARIANTS}, got {variant!r}")
  if variant != "toplabel":
    binned = {"top1_binned_brier": top1_bins["brier"], "top1_binned_ece": top1_bins["ece"]}
    return {"variant": variant, "top1_estimator": "bins", **row, **binned}
  binned = {
    "top1_binned_brier": row.pop("toplabel_brier"),
    "top1_binned_ece": row.pop("toplabel_ece"),
    "multiclass_brier": None,
  }
  return {"variant": variant, "top1_estimator": "toplabel", **row, **binned}
