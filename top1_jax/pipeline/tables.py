"""The sweep's tables as Markdown, and its tidy rows (formatting only: no files, no maths).

``tidy_rows`` are results.csv's rows: one per (file, score, k, estimator, bin count), the
file's settings (``COLUMNS``), then each metric's mean and std over splits. A file's
``method`` is ``deterministic`` (one network, one pass), ``mc_dropout``, ``ensemble``, or
``external`` (a user's file whose meta names none: its kind is unknown).
"""

import math
from collections.abc import Callable

from top1_jax.core import metrics, scores
from top1_jax.io import results

COLUMNS = results.COLUMNS
"""results.csv's settings columns, in order."""

DETERMINISTIC = "deterministic"
"""The method of one network without test-time sampling: stored and shown under this name."""

EXTERNAL = "external"
"""The method of a user's file whose meta names none (its kind unknown)."""

METHOD_ALIASES = {"plain": DETERMINISTIC}
"""Other stored names of a method, read as the one shown (``from_arrays`` wrote "plain")."""


def method_name(method: str | None) -> str:
  """The one name of a stored method: ``METHOD_ALIASES`` resolved, None -> ``EXTERNAL``."""
  return METHOD_ALIASES.get(method, method) if method else EXTERNAL


def file_columns(meta: dict, source: str, num_samples: int) -> dict:
  """A predictions file's settings columns, from its meta (None where it does not say)."""
  method = method_name(meta.get("method"))
  training = meta.get("training") or {}
  return {
    "dataset": meta.get("dataset"),
    "model": meta.get("model"),
    "method": method,
    "train_dropout_rate": meta.get("train_dropout_rate", training.get("train_dropout_rate")),
    "dropout_rate": float(meta.get("dropout_rate") or 0.0),
    "num_samples": int(meta.get("num_samples") or num_samples),
    "ensemble_size": int(meta.get("ensemble_size") or 0) if method == "ensemble" else 0,
    "seed": meta.get("seed"),
    "source": source,
    "shift": str(meta.get("shift") or results.CLEAN),
    "severity": severity(meta.get("severity")),
  }


def severity(value) -> int | float:
  """A shift's intensity as results.csv writes it: 15 (degrees), not 15.0; None is 0."""
  value = float(value or 0)
  return int(value) if value.is_integer() else value


def _rate(value: float | None) -> str:
  """A rate as Python's shortest repr of it: 0.05, and 0.1000001 apart from 0.1."""
  return "?" if value is None else repr(float(value))


def row_label(row: dict, varying: set[str] = frozenset()) -> str:
  """A row's readable name: ``dropout 0.05``, ``ensemble (5)``, or its file's name, prefixed
  with the settings of ``varying`` (dataset, model, train dropout rate, seed) it names."""
  method = row["method"]
  if method == "mc_dropout":
    label = f"dropout {_rate(row['dropout_rate'])}"
    if "num_samples" in varying:
      label += f", {row['num_samples']} samples"
  elif method == "ensemble":
    label = f"ensemble ({row['ensemble_size']})"
  else:  # predict's one network is <point>/deterministic.npz: it reads "deterministic"
    label = str(row.get("source") or method).rsplit("/", 1)[-1]
  prefix = [str(row[c]) for c in ("dataset", "model") if c in varying and row[c] is not None]
  if "train_dropout_rate" in varying:
    prefix.append(f"train dropout {_rate(row['train_dropout_rate'])}")
  if "seed" in varying:
    prefix.append(f"seed {row['seed']}")
  return f"{' '.join(prefix)}: {label}" if prefix else label


TRAINING = ("dataset", "model", "train_dropout_rate", "seed")
"""The settings a label names when a sweep mixes them."""


def varying(columns: list[dict], among: tuple[str, ...] = TRAINING) -> set[str]:
  """Which of the settings ``among`` differ between rows (e.g. files' ``file_columns``)."""
  return {c for c in among if len({str(row.get(c)) for row in columns}) > 1}


def tidy_rows(records: list[dict]) -> list[dict]:
  """One row per (file, score, k, estimator, bin count): settings, metrics, then ``label``."""
  mixed = varying([record["columns"] for record in records])
  rows = []
  for record in records:
    for row in record["rows"]:
      settings = {**record["columns"], "score": record["score"], "topk": record["topk"]}
      settings["method"] = method_name(settings["method"])  # a record saved before an alias
      settings["estimator"] = record.get("estimator", DEFAULT_ESTIMATOR)
      tidy = results.in_column_order({**settings, **row})  # reused records' keys are sorted
      tidy["label"] = row_label(tidy, mixed)
      rows.append(tidy)
  return rows


def cell(value: float | None, digits: int) -> str:
  """A table cell: "–" for an undefined metric; never "-0.0000" for a rounding residue."""
  if value is None:
    return "–"
  text = f"{value:.{digits}f}"
  return text[1:] if text.startswith("-") and float(text) == 0 else text


def _pm(mean: float | None, std: float | None, digits: int) -> str:
  return "–" if mean is None else f"{cell(mean, digits)} ± {cell(std, digits)}"


def eor_digits(mean: float | None) -> int:
  """Decimals of an EOR cell: an odds ratio reads to about three significant digits."""
  if mean is None or not math.isfinite(mean):
    return 2
  return 2 if mean < 10 else 1 if mean < 100 else 0


def _eor(mean: float | None, std: float | None) -> str:
  if mean is None or not math.isfinite(mean):
    return cell(mean, eor_digits(mean))  # no "± nan" beside an undefined mean
  return _pm(mean, std, eor_digits(mean))


def _defined_on(row: dict, metric: str, n_folds: int | None) -> str:
  """ " (k/F splits)" when the metric is undefined on some splits (one class in a half)."""
  count = row.get(f"{metric}_num_splits")
  return "" if count is None or n_folds is None or count == n_folds else f" ({count}/{n_folds})"


def metric_table(rows: list[dict], topk: int, n_bins: int, n_folds: int | None = None) -> str:
  ece = metrics.ece_name(n_bins, "equal-mass", calibration=True, percent=True)
  lines = [
    f"| method | score | Brier | NLL | {ece} | EOR | {metrics.BINNED_AUROC_NAME} | bins |",
    "|---|---|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    if r["topk"] != topk or r["n_bins"] != n_bins:
      continue
    ece = None if r["ece"] is None else (100 * r["ece"], 100 * r["ece_std"])
    lines.append(
      f"| {r['label']} | {score_cell(r)} | {cell(r['brier'], 4)} | {cell(r['nll'], 4)} "
      f"| {_pm(*(ece or (None, None)), 2)} "
      f"| {_eor(r['eor'], r['eor_std'])}{_defined_on(r, 'eor', n_folds)} "
      f"| {cell(r['auroc'], 3)}{_defined_on(r, 'auroc', n_folds)} "
      f"| {cell(r['num_effective_bins'], 0)} |"
    )
  return "\n".join(lines)


DEFAULT_ESTIMATOR = "bins"
"""The paper's estimator: rows and records of any other name it (``estimator_suffix``)."""


def estimator_suffix(estimator: str | None, form: str = " [{}]") -> str:
  """Nothing for the paper's bins, else ``form`` of the estimator (" [isotonic]")."""
  estimator = estimator or DEFAULT_ESTIMATOR
  return "" if estimator == DEFAULT_ESTIMATOR else form.format(estimator)


def score_cell(row: dict) -> str:
  """The score's label, and the estimator when it is not the paper's bins."""
  return scores.label(row["score"]) + estimator_suffix(row.get("estimator"))


def summary_table(rows: list[dict], metric: str, n_bins: int, topks: tuple[int, ...]) -> str:
  key = lambda r: (r["label"], r["score"], r.get("estimator", DEFAULT_ESTIMATOR))
  header = "| method | score | " + " | ".join(f"Top-{k}" for k in topks) + " |"
  lines = [header, "|---|---|" + "---:|" * len(topks)]
  for method, score, estimator in dict.fromkeys(map(key, rows)):
    cells = []
    for k in topks:
      wanted = (method, score, estimator)
      match = [r for r in rows if key(r) == wanted and (r["topk"], r["n_bins"]) == (k, n_bins)]
      if not match:
        cells.append("–")
      elif metric == "eor":
        cells.append(_eor(match[0]["eor"], match[0]["eor_std"]))
      else:
        cells.append(cell(match[0][metric], 4))
    label = score_cell({"score": score, "estimator": estimator})
    lines.append(f"| {method} | {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def markdown(rows: list[dict], config: dict, topks: tuple[int, ...], title: str) -> str:
  n_bins = config["n_bins"]
  parts = [
    f"# {title}",
    "",
    f"{config['n_folds']} {config['scheme']} calibration/test splits (seed {config['seed']}); "
    "mean ± std over splits. ECE, EOR and AUROC of the binned Top-k predictions; "
    "`bins` = bins left after merging tied edges (mean).",
  ]
  accuracy = {}
  for r in rows:
    accuracy.setdefault((r["label"], r["topk"]), r["accuracy"])
  parts += ["", "Test accuracy of each classifier (mean over test halves):", ""]
  parts += ["| method | " + " | ".join(f"Top-{k}" for k in topks) + " |"]
  parts += ["|---|" + "---:|" * len(topks)]
  for method in dict.fromkeys(m for m, _ in accuracy):
    cells = [cell(accuracy.get((method, k)), 4) for k in topks]
    parts.append(f"| {method} | " + " | ".join(cells) + " |")
  for k in topks:
    for n in n_bins:
      parts += ["", f"## Top-{k}, {n} bins", "", metric_table(rows, k, n, config["n_folds"])]
  largest = max(n_bins)
  parts += ["", f"## Brier score, {largest} bins (supplementary table)", ""]
  parts += [summary_table(rows, "brier", largest, topks)]
  parts += ["", f"## Expected odds ratio, {largest} bins (supplementary table)", ""]
  parts += [summary_table(rows, "eor", largest, topks)]
  return "\n".join(parts) + "\n"


def variant_label(label: str, variant: str) -> str:
  """A Table-1 row's name: "deterministic + temperature scaling"; raw is the label alone."""
  added = {"temperature": "temperature scaling", "toplabel": "top-label binning"}.get(variant)
  return label if added is None else f"{label} + {added}"


Value = Callable[[dict, str, int | None, float], str]
"""A table cell from a row: ``value(row, name, digits, scale)`` ("–" when undefined)."""


def run_value(row: dict, name: str, digits: int | None, scale: float = 1.0) -> str:
  """A run's cell: the value (a mean over splits) scaled, ``digits`` decimals (None: %g)."""
  value = row.get(name)
  if value is None:
    return "–"
  return f"{scale * value:g}" if digits is None else cell(scale * value, digits)


def _runs_column(header: list[str], across_runs: bool) -> list[str]:
  if not across_runs:
    return header
  return [header[0] + " runs |", header[1] + "---:|"]


COMPARISON_NOTE = (
  "Multiclass Brier scores the whole probability vector, Top-1 Brier only the event "
  '"the prediction is correct": compare Top-1 binning with the *raw pmax* columns, '
  "which use max-softmax directly as P(correct). The benchmark's confidence ECE is "
  "exactly the raw pmax's Top-1 ECE with equal-width bins."
)

ACROSS_RUNS = (
  "Each cell is the mean ± std across runs (ddof = 1; the mean alone for one run) of "
  "each run's mean over its splits; `runs`: the runs that hold the row."
)


def comparison_table(
  comparison: list[dict], *, value: Value = run_value, across_runs: bool = False
) -> str:
  """The paper's Table 1 (``sweep.runner.table1`` rows with their ``label``); ``value``
  formats a cell, ``across_runs`` adds a ``runs`` column for merged runs."""
  if not comparison:
    return ""
  n_bins, ece_bins = comparison[0]["top1_n_bins"], comparison[0]["ece_bins"]
  benchmark = metrics.ece_name(ece_bins, "equal-width", percent=True)
  binned = metrics.ece_name(n_bins, "equal-mass", calibration=True, percent=True)
  header = [
    "| method | binned score | multiclass Brier (benchmark) | Top-1 Brier: raw pmax "
    f"| Top-1 Brier: binned | {benchmark}: benchmark = raw pmax | {binned}: Top-1 binned |",
    "|---|---|---:|---:|---:|---:|---:|",
  ]
  lines = [
    f"## Benchmark metrics vs Top-1 binning (paper Table 1; {n_bins} Top-1 bins, "
    f"{ece_bins} equal-width ECE bins)",
    "",
    COMPARISON_NOTE + (" " + ACROSS_RUNS if across_runs else ""),
    "",
    *_runs_column(header, across_runs),
  ]
  for r in comparison:
    method = r["label"]
    if r["temperature"] != 1.0:
      method += f" (T = {value(r, 'temperature', 2, 1.0)})"
    toplabel = r.get("top1_estimator") == "toplabel"
    score = scores.label(r["top1_score"]) + (_per_class(r, value) if toplabel else "")
    ece = value(r, "top1_binned_ece", 2, 100.0) + (" †" if toplabel else "")
    runs = f" {r['num_runs']} |" if across_runs else ""
    lines.append(
      f"| {method} | {score} | {value(r, 'multiclass_brier', 4, 1.0)} "
      f"| {value(r, 'raw_top1_brier', 4, 1.0)} | {value(r, 'top1_binned_brier', 4, 1.0)} "
      f"| {value(r, 'confidence_ece', 2, 100.0)} | {ece} |{runs}"
    )
  top_label = [r for r in comparison if r.get("top1_estimator") == "toplabel"]
  if top_label:
    per_bin = top_label[0].get("toplabel_points_per_bin", "points_per_bin")
    lines += [
      "",
      "Top-label histogram binning (Gupta & Ramdas, ICLR 2022, as their reference code): for "
      f"each predicted class c, floor(n_c / {per_bin}) equal-mass bins of pmax over its n_c "
      "calibration examples, each bin predicting its accuracy; a class predicted fewer than "
      f'{per_bin} times keeps its raw pmax. "own bins": the classes that got bins, mean '
      "over the calibration parts. It predicts P(correct) only, so no multiclass Brier. "
      f"† its ECE is the equal-width ECE ({ece_bins} bins) of its P(correct), as the benchmark "
      "column; the other binned ECEs use the fitted quantile bins.",
    ]
  return "\n".join(lines)


def _per_class(row: dict, value: Value) -> str:
  """A top-label row's score suffix: how many classes got bins of their own, when known."""
  own, num_classes = row.get("toplabel_classes_with_own_bins"), row.get("toplabel_num_classes")
  if own is None or num_classes is None:
    return ", per predicted class"
  own = value(row, "toplabel_classes_with_own_bins", None, 1.0)
  return f", per predicted class (own bins: {own} of {num_classes} classes)"


def selective_table(
  rows: list[dict], *, value: Value = run_value, across_runs: bool = False
) -> str:
  """Selective prediction with a guarantee: one line per (file, target accuracy);
  ``value`` and ``across_runs`` as ``comparison_table``."""
  if not rows:
    return ""
  first = rows[0]
  header = [
    "| method | score | target | guaranteed accuracy | test coverage | test accuracy "
    "| splits: nothing selected | splits: test accuracy < target |",
    "|---|---|---:|---:|---:|---:|---:|---:|",
  ]
  across = " " + ACROSS_RUNS + " Splits are counted over all runs." if across_runs else ""
  lines = [
    "## Selective prediction with a guarantee",
    "",
    f"Top-1 event; {first['n_bins']} bins of each file's headline score fitted on each "
    "calibration part; the largest set of most-confident bins whose accuracy is at least the "
    f"target with probability {1 - first['delta']:g} (Geifman & El-Yaniv's SGR), applied to the "
    "test part. Means over splits; the guaranteed (lower bound) and test accuracies over the "
    "splits that selected something." + across,
    "",
    *_runs_column(header, across_runs),
  ]
  for r in rows:
    runs = f" {r['num_runs']} |" if across_runs else ""
    lines.append(
      f"| {r['label']} | {scores.label(r['score'])} | {r['target_accuracy']:g} "
      f"| {value(r, 'guaranteed_accuracy', 4, 1.0)} | {value(r, 'test_coverage', 1, 100.0)}% "
      f"| {value(r, 'test_accuracy', 4, 1.0)} | {r['num_empty']}/{r['num_splits']} "
      f"| {r['num_below_target']}/{r['num_splits']} |{runs}"
    )
  return "\n".join(lines)


def pm_value(row: dict, name: str, digits: int | None, scale: float = 1.0) -> str:
  """A run's cell with its spread: "mean ± std" over the splits (``Value``)."""
  mean, std = row.get(name), row.get(f"{name}_std")
  return _pm(None if mean is None else scale * mean, None if std is None else scale * std, digits)


def sets_table(rows: list[dict], *, value: Value = pm_value) -> str:
  """Prediction sets with a coverage guarantee: one line per (file, method, alpha)."""
  if not rows:
    return ""
  lines = [
    "## Prediction sets with a coverage guarantee",
    "",
    "Split conformal sets (``evaluation.sets``) fitted on each calibration part and scored on "
    "its test part: the share of test labels in their set (at least 1 - alpha on average, "
    "by construction), the mean set size, and the size-stratified coverage violation (SSCV, "
    "the RAPS paper's adaptivity: the largest shortfall of coverage among set sizes; 0 is "
    "ideal). topk: the smallest Top-k whose calibrated P(label in Top-k) (the paper's bins) "
    "reaches a conformal threshold. Means ± std over the splits (merged runs: across runs).",
    "",
    "| model | method | alpha | coverage | mean size | SSCV |",
    "|---|---|---:|---:|---:|---:|",
  ]
  lines += [
    f"| {r['label']} | {r['estimator']} | {r['alpha']:g} "
    f"| {value(r, 'coverage', 3)} | {value(r, 'mean_size', 2)} | {value(r, 'sscv', 3)} |"
    for r in rows
  ]
  return "\n".join(lines)
