"""The shift protocol's Markdown tables and the methods (*variants*, ``VARIANTS``) they
compare: Ovadia et al.'s, each its own probability as P(correct), beside calibrated scores.
"""

import math
import operator
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from top1_jax.core import metrics
from top1_jax.engine import corruptions
from top1_jax.io import results
from top1_jax.pipeline import tables

LOG_PROBS_SCORE = "neg_log_pmax"
"""The score that bins the methods on the log-probabilities (raw, temperature, top-label)
for the binned metrics: pmax's tie-free twin (``scores.RANKING_TWINS``)."""


def _variant(method: str, estimator: str, score: str = LOG_PROBS_SCORE) -> dict:
  """A variant's selector; estimator "raw": the method's own max probability as P(correct)."""
  return {"method": method, "estimator": estimator, "score": score}


VARIANTS: dict[str, dict] = {
  "Vanilla": _variant("deterministic", "raw"),
  "Temp scaling": _variant("deterministic", "temperature"),
  "Dropout": _variant("mc_dropout", "raw"),
  "Ensemble": _variant("ensemble", "raw"),
  "Top-label bins": _variant("deterministic", "toplabel"),
  "Bins: pmax": _variant("deterministic", "bins", "pmax"),
  "Isotonic: pmax": _variant("deterministic", "isotonic", "pmax"),
  "Bins: dropout cov. 2-norm": _variant("mc_dropout", "bins", "covariance_norm_probs"),
  "Bins: ensemble cov. 2-norm": _variant("ensemble", "bins", "covariance_norm_probs"),
  "Bins: ensemble pmax": _variant("ensemble", "bins", "pmax"),
}
"""Display label -> the columns of its rows, in the tables' and figures' order."""


def matches(row: Mapping, selector: Mapping) -> bool:
  return all(row.get(column) == value for column, value in selector.items())


def model_of(row: Mapping) -> tuple:
  return tuple(row[c] for c in tables.TRAINING)  # dataset, model, train dropout rate, seed


def grouped(rows: Sequence[Mapping], key: Callable = model_of) -> dict:
  """``rows`` by ``key(row)``, in their order."""
  out: dict = {}
  for row in rows:
    out.setdefault(key(row), []).append(row)
  return out


FIGURE_VARIANTS = (
  "Vanilla", "Temp scaling", "Dropout", "Ensemble", "Bins: pmax", "Bins: ensemble cov. 2-norm"
)  # fmt: skip
"""The variants a figure compares (the tables show every one of ``VARIANTS``)."""


def present_variants(
  rows: Sequence[Mapping], n_bins: int, labels: Sequence[str] = tuple(VARIANTS)
) -> dict[str, dict]:
  """The ``VARIANTS`` of ``labels`` with clean rows at ``n_bins``, each selector given
  ``n_bins`` and (MC dropout) the smallest dropout rate: one row per set."""
  chosen = {}
  for label in labels:
    selector = {**VARIANTS[label], "n_bins": n_bins, "shift": results.CLEAN}
    found = [r for r in rows if matches(r, selector)]
    if found:
      if selector["method"] == "mc_dropout":
        selector["dropout_rate"] = min(r["dropout_rate"] for r in found)
        rate = f"{selector['dropout_rate']:g}"
        label = label.replace("Dropout", f"Dropout {rate}").replace("dropout", f"dropout {rate}")
      del selector["shift"]
      chosen[label] = selector
  return chosen


def _value(rows, selector, shift, severity, metric) -> float | None:
  for row in rows:
    if row["shift"] == shift and row["severity"] == severity and matches(row, selector):
      value = row.get(metric)
      return None if value is None or not math.isfinite(value) else float(value)
  return None


METRICS = ("accuracy", "brier", "nll", "ece", "auroc")
"""The metrics the tables show, in order."""


def metric_title(metric: str, n_bins: int) -> str:
  """A metric's heading."""
  if metric == "ece":
    return tables.ece_title(n_bins)
  titles = {"accuracy": "accuracy (%)", "brier": "Brier", "nll": "NLL"}
  return titles.get(metric, metrics.BINNED_AUROC_NAME)


def metric_format(metric: str) -> tuple[float, int]:
  """A metric's cell: (scale, decimals)."""
  return (100.0, 2) if metric in ("ece", "accuracy") else (1.0, 3 if metric == "auroc" else 4)


def _shown(variants: dict, metric: str) -> dict:
  """The variants a metric's table lists: for accuracy, which calibration leaves unchanged,
  one per method."""
  if metric != "accuracy":
    return variants
  return {k: v for k, v in variants.items() if v["estimator"] == "raw"} or variants


def geometric_table(rows, variants, shift: str, metric: str) -> str:
  """Variants x intensities of one shift (the clean rows at 0)."""
  levels = [0, *sorted({r["severity"] for r in rows if r["shift"] == shift})]
  sets = [(results.CLEAN if level == 0 else shift, level) for level in levels]
  scale, digits = metric_format(metric)
  lines = tables.md_head(["method", *(f"{level:g}" for level in levels)], spaced=True)
  for label, selector in _shown(variants, metric).items():
    cells = [tables.cell(_value(rows, selector, *at, metric), digits, scale) for at in sets]
    lines.append(tables.md_row([label, *cells]))
  return "\n".join(lines)


def corruption_table(rows, variants, metric: str) -> str:
  """Variants x intensity 0-5: the mean over the corruptions (and the worst)."""
  names = [n for n in corruptions.names() if any(r["shift"] == n for r in rows)]
  levels = sorted({r["severity"] for r in rows if r["shift"] in names})
  scale, digits = metric_format(metric)
  header = ["method", "clean", *(f"{level:g}: mean (worst)" for level in levels)]
  lines = tables.md_head(header, spaced=True)
  worst = max if metric not in ("accuracy", "auroc") else min
  for label, selector in _shown(variants, metric).items():
    cells = [tables.cell(_value(rows, selector, results.CLEAN, 0, metric), digits, scale)]
    for level in levels:
      values = [_value(rows, selector, n, level, metric) for n in names]
      cells.append(_mean_and_worst(values, metric, worst))
    lines.append(tables.md_row([label, *cells]))
  return "\n".join(lines)


def ood_table(ood_rows, variants) -> str:
  """Per variant and OOD set: the in- vs out-of-distribution AUROC of its score and the
  mean P(correct) on the OOD inputs, beside the clean test inputs'."""
  sets = list(dict.fromkeys(r["shift"] for r in ood_rows))
  header = ["method", "score"]
  for name in sets:
    header += [f"{name}: AUROC", f"{name}: mean P(correct)"]
  lines = tables.md_head([*header, "clean: mean P(correct)"], 2, spaced=True)
  for label, selector in variants.items():
    selector = {k: v for k, v in selector.items() if k != "n_bins"}
    found = [r for r in ood_rows if matches(r, selector)]
    if not found:
      continue
    cells = [label, found[0]["score"]]
    for name in sets:
      row = next((r for r in found if r["shift"] == name), {})
      cells += [tables.cell(row.get("ood_auroc"), 3), tables.cell(row.get("p_correct_mean"), 3)]
    lines.append(tables.md_row([*cells, tables.cell(found[0]["clean_p_correct_mean"], 3)]))
  return "\n".join(lines)


# After m labels (recalibration.csv) and without labels (accuracy_estimates.csv).
WITHIN = 0.01
"""How close to its clean ECE a recalibrated method must come (1 percentage point)."""


def _mean_and_worst(values: list, metric: str, worst=max) -> str:
  """ "mean (worst)" of the defined ``values``; "–" if none is."""
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return "–"
  scale, digits = metric_format(metric)
  mean = float(np.mean(values))
  return f"{tables.cell(mean, digits, scale)} ({tables.cell(worst(values), digits, scale)})"


def labels_needed(rows: Sequence[Mapping], within: float = WITHIN) -> int | None:
  """The fewest labels m at which a method's mean ECE over the shifted sets is within
  ``within`` of its clean ECE (m = 0 on the clean set), from its recalibration ``rows``;
  None if no m is."""
  clean = [r["ece"] for r in rows if r["shift"] == results.CLEAN and r["num_labels"] == 0]
  if not clean or clean[0] is None:
    return None
  for m in sorted({r["num_labels"] for r in rows}):
    shifted = [r["ece"] for r in rows if r["num_labels"] == m and r["shift"] != results.CLEAN]
    shifted = [v for v in shifted if v is not None]
    if shifted and float(np.mean(shifted)) <= clean[0] + within:
      return m
  return None


def recalibration_table(rows: Sequence[Mapping], metric: str) -> str:
  """Per recalibration and score of one model: ``metric`` on the clean set and its mean
  (worst) over the shifted sets after each m labels; for the ECE, ``labels_needed``."""
  counts = sorted({r["num_labels"] for r in rows})
  header = ["recalibration", "score", "clean", *(f"m = {m}: mean (worst)" for m in counts)]
  if metric == "ece":
    header.append("labels to within 1 pp of clean")
  lines = tables.md_head(header, 2, spaced=True)
  for key, mine in grouped(rows, operator.itemgetter("recalibration", "score")).items():
    clean = [r[metric] for r in mine if r["shift"] == results.CLEAN and r["num_labels"] == 0]
    scale, digits = metric_format(metric)
    cells = [*key, tables.cell(clean[0] if clean else None, digits, scale)]
    for m in counts:
      shifted = [r[metric] for r in mine if r["num_labels"] == m and r["shift"] != results.CLEAN]
      cells.append(_mean_and_worst(shifted, metric))
    if metric == "ece":
      needed = labels_needed(mine)
      cells.append("none" if needed is None else str(needed))
    lines.append(tables.md_row(cells))
  return "\n".join(lines)


def _family(row: Mapping) -> str:
  """A set's shift family: clean, a geometric shift, corruptions, or OOD."""
  if results.is_ood(row["shift"]) or row["shift"] == results.CLEAN:
    return row["shift"]
  return row["shift"] if row["shift"] in results.GEOMETRIC_SHIFTS else "corruptions"


def accuracy_table(rows: Sequence[Mapping], titles: Mapping[str, str]) -> str:
  """Per estimator and score of one model, in percentage points: its error on the clean
  set, its mean absolute error over the shifted sets (all and by family), and what it
  predicts on each OOD set."""
  families = [f for f in dict.fromkeys(map(_family, rows)) if f != results.CLEAN]
  shifted = [f for f in families if not results.is_ood(f)]
  header = ["estimator", "score", "clean: error", "shifted: MAE", *(f"{f}: MAE" for f in shifted)]
  header += [f"{f}: predicted" for f in families if results.is_ood(f)]
  lines = tables.md_head(header, 2, spaced=True)
  for key, mine in grouped(rows, operator.itemgetter("estimator", "score")).items():
    cells = [titles.get(key[0], key[0]), key[1]]
    clean = [r["error"] for r in mine if _family(r) == results.CLEAN]
    cells.append(tables.cell(clean[0] if clean else None, 2, 100.0))
    for family in [None, *shifted]:
      wanted = shifted if family is None else (family,)
      errors = [r["absolute_error"] for r in mine if _family(r) in wanted]
      cells.append(tables.cell(float(np.mean(errors)) if errors else None, 2, 100.0))
    for family in families:
      if results.is_ood(family):
        found = [r["predicted_accuracy"] for r in mine if _family(r) == family]
        cells.append(tables.cell(found[0] if found else None, 2, 100.0))
    lines.append(tables.md_row(cells))
  return "\n".join(lines)
