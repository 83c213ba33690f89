"""The shift protocol's Markdown tables and the methods its tables and figures compare.

A *variant* is a display label and the column values that pick its rows from the tidy
rows (``VARIANTS``): Ovadia et al.'s methods (Vanilla, temperature scaling, MC dropout
and the ensemble, each its own probability as P(correct)) beside the paper's bins and
the other estimators of the same scores.
"""

import math
from collections.abc import Mapping, Sequence

import numpy as np

from top1_jax.engine import corruptions
from top1_jax.io import results
from top1_jax.pipeline import tables

LOG_PROBS_SCORE = "neg_log_pmax"
"""The score that bins the methods on the log-probabilities (raw, temperature, top-label)
for the binned metrics: pmax's tie-free twin (``scores.RANKING_TWINS``)."""

_OWN = {"estimator": "raw", "score": LOG_PROBS_SCORE}  # a method's own max probability
VARIANTS: dict[str, dict] = {
  "Vanilla": {"method": "deterministic", **_OWN},
  "Temp scaling": {"method": "deterministic", "estimator": "temperature", "score": LOG_PROBS_SCORE},
  "Dropout": {"method": "mc_dropout", **_OWN},
  "Ensemble": {"method": "ensemble", **_OWN},
  "Top-label bins": {"method": "deterministic", "estimator": "toplabel", "score": LOG_PROBS_SCORE},
  "Bins: pmax": {"method": "deterministic", "estimator": "bins", "score": "pmax"},
  "Isotonic: pmax": {"method": "deterministic", "estimator": "isotonic", "score": "pmax"},
  "Bins: dropout cov. 2-norm": {
    "method": "mc_dropout", "estimator": "bins", "score": "covariance_norm_probs"
  },
  "Bins: ensemble cov. 2-norm": {
    "method": "ensemble", "estimator": "bins", "score": "covariance_norm_probs"
  },
  "Bins: ensemble pmax": {"method": "ensemble", "estimator": "bins", "score": "pmax"},
}  # fmt: skip
"""Display label -> the columns of its rows, in the tables' and figures' order."""

GEOMETRIC = results.GEOMETRIC_SHIFTS


def matches(row: Mapping, selector: Mapping) -> bool:
  return all(row.get(column) == value for column, value in selector.items())


FIGURE_VARIANTS = (
  "Vanilla", "Temp scaling", "Dropout", "Ensemble", "Bins: pmax", "Bins: ensemble cov. 2-norm"
)  # fmt: skip
"""The variants a figure compares (the tables show every one of ``VARIANTS``)."""


def present_variants(
  rows: Sequence[Mapping], n_bins: int, labels: Sequence[str] = tuple(VARIANTS)
) -> dict[str, dict]:
  """The ``VARIANTS`` of ``labels`` that have clean rows at ``n_bins``, each selector with
  ``n_bins`` and (MC dropout) the smallest dropout rate added: one row per set."""
  chosen = {}
  for label in labels:
    selector = VARIANTS[label]
    selector = {**selector, "n_bins": n_bins, "shift": results.CLEAN}
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


def _severities(rows, shift) -> list:
  return sorted({r["severity"] for r in rows if r["shift"] == shift})


def _line(cells) -> str:
  return "| " + " | ".join(cells) + " |"


METRIC_TITLES = {
  "accuracy": "accuracy (%)",
  "brier": "Brier",
  "nll": "NLL",
  "ece": "ECE (%)",
  "auroc": "AUROC of correct vs wrong",
}
"""The metrics the tables show, and their headings."""


def _digits(metric: str) -> tuple[float, int]:
  return (100.0, 2) if metric in ("ece", "accuracy") else (1.0, 3 if metric == "auroc" else 4)


def _shown(variants: dict, metric: str) -> dict:
  """The variants a metric's table lists: for accuracy, one per method (a method's
  accuracy is its own, whatever calibrates it)."""
  if metric != "accuracy":
    return variants
  return {k: v for k, v in variants.items() if v["estimator"] == "raw"} or variants


def geometric_table(rows, variants, shift: str, metric: str) -> str:
  """Variants x intensities of one shift (the clean rows at 0)."""
  levels = [0, *_severities(rows, shift)]
  scale, digits = _digits(metric)
  variants = _shown(variants, metric)
  lines = [_line(["method", *(f"{level:g}" for level in levels)])]
  lines.append(_line(["---", *(["---:"] * len(levels))]))
  for label, selector in variants.items():
    cells = []
    for level in levels:
      shift_name = results.CLEAN if level == 0 else shift
      value = _value(rows, selector, shift_name, level, metric)
      cells.append(tables.cell(None if value is None else scale * value, digits))
    lines.append(_line([label, *cells]))
  return "\n".join(lines)


def corruption_table(rows, variants, metric: str) -> str:
  """Variants x intensity 0-5: the mean over the corruptions (and the worst)."""
  names = [n for n in corruptions.names() if any(r["shift"] == n for r in rows)]
  levels = sorted({r["severity"] for r in rows if r["shift"] in names})
  scale, digits = _digits(metric)
  variants = _shown(variants, metric)
  lines = [_line(["method", "clean", *(f"{level:g}: mean (worst)" for level in levels)])]
  lines.append(_line(["---", "---:", *(["---:"] * len(levels))]))
  worst = max if metric not in ("accuracy", "auroc") else min
  for label, selector in variants.items():
    clean = _value(rows, selector, results.CLEAN, 0, metric)
    cells = [tables.cell(None if clean is None else scale * clean, digits)]
    for level in levels:
      values = [_value(rows, selector, n, level, metric) for n in names]
      values = [v for v in values if v is not None]
      if not values:
        cells.append("–")
        continue
      mean, bad = scale * float(np.mean(values)), scale * worst(values)
      cells.append(f"{tables.cell(mean, digits)} ({tables.cell(bad, digits)})")
    lines.append(_line([label, *cells]))
  return "\n".join(lines)


def ood_table(ood_rows, variants) -> str:
  """Per variant and OOD set: the AUROC of in- vs out-of-distribution by its score, and
  the mean predicted P(correct) on the OOD inputs beside the clean test inputs'."""
  sets = list(dict.fromkeys(r["shift"] for r in ood_rows))
  header = ["method", "score"]
  for name in sets:
    header += [f"{name}: AUROC", f"{name}: mean P(correct)"]
  lines = [
    _line([*header, "clean: mean P(correct)"]),
    _line(["---", "---", *["---:"] * (len(header) - 1)]),
  ]
  for label, selector in variants.items():
    selector = {k: v for k, v in selector.items() if k != "n_bins"}
    found = [r for r in ood_rows if matches(r, selector)]
    if not found:
      continue
    cells = [label, found[0]["score"]]
    for name in sets:
      row = next((r for r in found if r["shift"] == name), None)
      cells += [
        tables.cell(None if row is None else row["ood_auroc"], 3),
        tables.cell(None if row is None else row["p_correct_mean"], 3),
      ]
    lines.append(_line([*cells, tables.cell(found[0]["clean_p_correct_mean"], 3)]))
  return "\n".join(lines)
