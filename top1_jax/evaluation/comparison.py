"""The paper's Table 1: the benchmark's metrics of a classifier, on the Top-1 splits.

Each variant is a method of ``protocol.evaluate`` on the splits the Top-1 bins are
cross-validated on, its metrics averaged over the splits: ``"raw"`` (the softmax as it is),
``"temperature"`` (T fitted on each calibration part) and ``"toplabel"`` (top-label
histogram binning, Gupta & Ramdas; P(correct) only). ``table_row`` puts a variant beside
the Top-1 bins' own Brier and ECE.
"""

from collections.abc import Mapping

import numpy as np
from jax.typing import ArrayLike

from top1_jax.core import equal_width, events, validation
from top1_jax.core.splits import Splits
from top1_jax.estimators import toplabel
from top1_jax.evaluation import protocol

VARIANTS = ("raw", "temperature", "toplabel")
"""Every variant ``baseline_rows`` scores, in its order (a model with samples: raw only)."""


def baseline_rows(
  log_probs: ArrayLike,
  labels: ArrayLike,
  splits: Splits,
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
    single_model: one network (no MC samples, no ensemble): adds the rows of temperature
      scaling and top-label binning.
    ece_bins: equal-width bins of the confidence ECE (15 in the benchmark).
    points_per_bin: top-label binning's calibration examples per bin.
    label_terms: ``events.label_terms(log_probs, labels)`` if already computed, or None.

  Returns:
    One dict per variant (``VARIANTS``; "raw" only unless ``single_model``): ``variant``
    and the means over splits of ``multiclass_brier``, ``confidence_ece``,
    ``raw_top1_brier`` (of its own pmax) and ``temperature`` (1.0 but for "temperature").
    "toplabel" repeats the raw metrics and adds ``toplabel_brier``, ``toplabel_ece``,
    ``toplabel_classes_with_own_bins``, ``toplabel_num_classes`` (K) and
    ``toplabel_points_per_bin``.
  """
  log_probs = validation.float_array("log_probs", log_probs, 2)  # a jax array: never copied
  if log_probs.shape[-1] < 2:
    raise ValueError(f"log_probs: expected at least 2 classes, got shape {log_probs.shape}")
  labels = validation.labels_array("labels", labels, log_probs.shape[-1], host=True)
  num = validation.same_length(log_probs=log_probs, labels=labels)
  protocol.check_splits(splits, num, "log_probs")
  protocol.bin_counts(1, splits)  # every split has calibration and test examples
  if label_terms is None:
    label_terms = events.label_terms(log_probs, labels)
  validation.instance("label_terms", label_terms, events.LabelTerms, "events.LabelTerms")
  pmax, rank = np.asarray(label_terms.pmax), np.asarray(label_terms.rank)
  if pmax.shape != (num,) or rank.shape != (num,):
    raise ValueError(f"label_terms: expected [{num}] arrays, got shapes {[rank.shape, pmax.shape]}")
  points_per_bin = validation.positive_int("points_per_bin", points_per_bin)
  ece_bins = equal_width.checked_n_bins(ece_bins, "ece_bins")
  data = protocol.Data(rank < 1, {"pmax": pmax}, log_probs, labels)
  variants = VARIANTS if single_model else VARIANTS[:1]
  options = {"toplabel": {"points_per_bin": points_per_bin}}
  chosen = [protocol.method(name, "pmax", options.get(name, {})) for name in variants]
  found = protocol.evaluate_checked(data, splits, chosen, None, (1,), 1, ece_bins)
  means = [
    {"raw_top1_brier": float(r.metrics.mean["brier"][0]), "temperature": 1.0}
    | {name: float(np.mean(values)) for name, values in r.extras.items()}
    for r in found
  ]
  keys = ("multiclass_brier", "confidence_ece", "raw_top1_brier", "temperature")
  rows = [{"variant": v} | {key: means[i][key] for key in keys} for i, v in enumerate(variants[:2])]
  if single_model:
    binned = means[2]
    rows.append({
      **rows[0], "variant": "toplabel", "toplabel_brier": binned["raw_top1_brier"],
      "toplabel_ece": binned["confidence_ece"],
      "toplabel_classes_with_own_bins": binned["classes_with_own_bins"],
      "toplabel_num_classes": data.log_probs.shape[-1], "toplabel_points_per_bin": points_per_bin,
    })  # fmt: skip
  return rows


def table_row(row: Mapping[str, str | float], top1_bins: Mapping[str, float | None]) -> dict:
  """A Table-1 row: ``row`` (one of ``baseline_rows``) with ``top1_estimator``,
  ``top1_binned_brier`` and ``top1_binned_ece``.

  "raw" and "temperature" take the Top-1 bins' ``top1_bins["brier"]`` and ``["ece"]`` (a
  row of ``CrossValidation.rows()``). Top-label binning is itself a binning of pmax: its
  own Brier and ECE fill the binned cells, its ``multiclass_brier`` is None.
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
