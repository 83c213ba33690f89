"""The sweep's tables as Markdown, and its tidy rows (formatting only: no files, no maths).

A file's ``method`` is ``deterministic`` (one network, one pass), ``mc_dropout``,
``ensemble``, or ``external`` (a user's file whose meta names none).
"""

import math
from collections.abc import Callable

from top1_jax.core import metrics, scores
from top1_jax.io import results

METHOD_ALIASES = {"plain": "deterministic"}
"""Other stored names of a method, read as the one shown (``from_arrays`` wrote "plain")."""


def method_name(method: str | None) -> str:
  """The one name of a stored method: ``METHOD_ALIASES`` resolved, None -> "external"."""
  return METHOD_ALIASES.get(method, method) if method else "external"


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
  """results.csv's rows: one per (file, score, k, estimator, bin count), the file's settings
  (``results.COLUMNS``), each metric's mean and std over splits, then ``label``."""
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


def cell(value: float | None, digits: int, scale: float = 1.0) -> str:
  """A table cell of ``scale * value``: "–" for an undefined metric; never "-0.0000" for a
  rounding residue."""
  if value is None:
    return "–"
  text = f"{scale * value:.{digits}f}"
  return text[1:] if text.startswith("-") and float(text) == 0 else text


def md_row(cells) -> str:
  """One line of a Markdown table."""
  return "| " + " | ".join(cells) + " |"


def md_head(header: list[str], left: int = 1, spaced: bool = False) -> list[str]:
  """A Markdown table's header and rule: ``left`` columns aligned left, the rest right;
  ``spaced``: the rule's cells spaced as ``md_row``'s."""
  rule = ["---"] * left + ["---:"] * (len(header) - left)
  return [md_row(header), md_row(rule) if spaced else "|" + "|".join(rule) + "|"]


def eor_digits(mean: float | None) -> int:
  """Decimals of an EOR cell: an odds ratio reads to about three significant digits."""
  return 2 if mean is None or not math.isfinite(mean) or mean < 10 else 1 if mean < 100 else 0


def _eor(row: dict) -> str:
  mean = row["eor"]
  if mean is None or not math.isfinite(mean):
    return cell(mean, eor_digits(mean))  # no "± nan" beside an undefined mean
  return pm_value(row, "eor", eor_digits(mean))


def _defined_on(row: dict, metric: str, n_folds: int | None) -> str:
  """ " (k/F splits)" when the metric is undefined on some splits (one class in a half)."""
  count = row.get(f"{metric}_num_splits")
  return "" if count is None or n_folds is None or count == n_folds else f" ({count}/{n_folds})"


def ece_title(n_bins: int | str) -> str:
  """The binned predictions' ECE (%) as every table names it; ``n_bins`` may be "N"."""
  return metrics.ece_name(n_bins, "equal-mass", calibration=True, percent=True)


def metric_names(n_bins: int | str) -> list[str]:
  """The headers of ``metric_cells``."""
  return ["Brier", "NLL", ece_title(n_bins), "EOR", metrics.BINNED_AUROC_NAME]


def metric_cells(row: dict, value: "Value") -> list[str]:
  """A sweep row's Brier, NLL, ECE (%), EOR and AUROC, each formatted by ``value``."""
  return [
    value(row, "brier", 4, 1.0), value(row, "nll", 4, 1.0), value(row, "ece", 2, 100.0),
    value(row, "eor", eor_digits(row.get("eor")), 1.0), value(row, "auroc", 3, 1.0),
  ]  # fmt: skip


def metric_table(rows: list[dict], topk: int, n_bins: int, n_folds: int | None = None) -> str:
  lines = md_head(["method", "score", *metric_names(n_bins), "bins"], 2)
  for r in rows:
    if (r["topk"], r["n_bins"]) == (topk, n_bins):
      lines.append(md_row([
        r["label"], score_cell(r), cell(r["brier"], 4), cell(r["nll"], 4),
        pm_value(r, "ece", 2, 100.0), _eor(r) + _defined_on(r, "eor", n_folds),
        cell(r["auroc"], 3) + _defined_on(r, "auroc", n_folds), cell(r["num_effective_bins"], 0),
      ]))  # fmt: skip
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
  lines = md_head(["method", "score", *(f"Top-{k}" for k in topks)], 2)
  shown = _eor if metric == "eor" else lambda row: cell(row[metric], 4)
  for wanted in dict.fromkeys(map(key, rows)):
    method, score, estimator = wanted
    cells = [method, score_cell({"score": score, "estimator": estimator})]
    for k in topks:
      match = [r for r in rows if key(r) == wanted and (r["topk"], r["n_bins"]) == (k, n_bins)]
      cells.append(shown(match[0]) if match else "–")
    lines.append(md_row(cells))
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
  parts += md_head(["method", *(f"Top-{k}" for k in topks)])
  for method in dict.fromkeys(m for m, _ in accuracy):
    parts.append(md_row([method, *(cell(accuracy.get((method, k)), 4) for k in topks)]))
  for k in topks:
    for n in n_bins:
      parts += ["", f"## Top-{k}, {n} bins", "", metric_table(rows, k, n, config["n_folds"])]
  largest = max(n_bins)
  for metric, name in (("brier", "Brier score"), ("eor", "Expected odds ratio")):
    parts += ["", f"## {name}, {largest} bins (supplementary table)", ""]
    parts.append(summary_table(rows, metric, largest, topks))
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
  if digits is None and value is not None:
    return f"{scale * value:g}"
  return cell(value, digits, scale)


def mean_std(row: dict, name: str, digits: int | None, scale: float = 1.0) -> str:
  """A merged cell (``Value``): "mean ± std" (the mean alone without a std), and "(k/n)"
  where only k of the n runs define it; ``digits`` None: 3 significant."""
  mean, std = row.get(name), row.get(f"{name}_std")
  if mean is None:
    return "–"

  def text(value: float) -> str:
    return f"{scale * value:.3g}" if digits is None else cell(value, digits, scale)

  out = text(mean) if std is None else f"{text(mean)} ± {text(std)}"
  count = row.get(f"{name}_num_runs")
  if count is not None and count != row.get("num_runs"):
    out += f" ({count}/{row['num_runs']})"
  return out


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


def comparison_cells(row: dict, value: Value, per_class: bool = False) -> list[str]:
  """A Table-1 row's method (with its fitted T), binned score (``per_class``: with a
  top-label row's classes that got bins), multiclass Brier, raw and binned Top-1 Brier,
  and raw and binned ECE ("†" on top-label binning's, equal-width)."""
  method, toplabel = row["label"], row.get("top1_estimator") == "toplabel"
  if row.get("temperature") not in (None, 1.0):
    method += f" (T = {value(row, 'temperature', 2, 1.0)})"
  score = scores.label(row["top1_score"])
  score += _per_class(row, value) if per_class and toplabel else ""
  return [
    method, score, value(row, "multiclass_brier", 4, 1.0), value(row, "raw_top1_brier", 4, 1.0),
    value(row, "top1_binned_brier", 4, 1.0), value(row, "confidence_ece", 2, 100.0),
    value(row, "top1_binned_ece", 2, 100.0) + (" †" if toplabel else ""),
  ]  # fmt: skip


def comparison_table(
  comparison: list[dict], *, value: Value = run_value, across_runs: bool = False
) -> str:
  """The paper's Table 1 (``sweep.table1``'s rows); ``value`` formats a cell,
  ``across_runs`` adds a ``runs`` column for merged runs."""
  if not comparison:
    return ""
  n_bins, ece_bins = comparison[0]["top1_n_bins"], comparison[0]["ece_bins"]
  benchmark = metrics.ece_name(ece_bins, "equal-width", percent=True)
  header = ["method", "binned score", "multiclass Brier (benchmark)", "Top-1 Brier: raw pmax"]
  header += ["Top-1 Brier: binned", f"{benchmark}: benchmark = raw pmax"]
  header += [f"{ece_title(n_bins)}: Top-1 binned", *(["runs"] if across_runs else [])]
  lines = [
    f"## Benchmark metrics vs Top-1 binning (paper Table 1; {n_bins} Top-1 bins, "
    f"{ece_bins} equal-width ECE bins)",
    "",
    COMPARISON_NOTE + (" " + ACROSS_RUNS if across_runs else ""),
    "",
    *md_head(header, 2),
  ]
  for r in comparison:
    runs = [str(r["num_runs"])] if across_runs else []
    lines.append(md_row([*comparison_cells(r, value, per_class=True), *runs]))
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


def selective_cells(row: dict, value: Value, unit: str = "") -> list[str]:
  """A selective row's cells; ``unit`` follows its test coverage (in %)."""
  return [
    row["label"], scores.label(row["score"]), f"{row['target_accuracy']:g}",
    value(row, "guaranteed_accuracy", 4, 1.0), value(row, "test_coverage", 1, 100.0) + unit,
    value(row, "test_accuracy", 4, 1.0), f"{row['num_empty']}/{row['num_splits']}",
    f"{row['num_below_target']}/{row['num_splits']}",
  ]  # fmt: skip


def selective_table(
  rows: list[dict], *, value: Value = run_value, across_runs: bool = False
) -> str:
  """Selective prediction with a guarantee: one line per (file, target accuracy);
  ``value`` and ``across_runs`` as ``comparison_table``."""
  if not rows:
    return ""
  first = rows[0]
  header = ["method", "score", "target", "guaranteed accuracy", "test coverage"]
  header += ["test accuracy", "splits: nothing selected", "splits: test accuracy < target"]
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
    *md_head([*header, *(["runs"] if across_runs else [])], 2),
  ]
  for r in rows:
    runs = [str(r["num_runs"])] if across_runs else []
    lines.append(md_row([*selective_cells(r, value, "%"), *runs]))
  return "\n".join(lines)


def pm_value(row: dict, name: str, digits: int | None, scale: float = 1.0) -> str:
  """A run's cell with its spread: "mean ± std" over the splits (``Value``)."""
  mean, std = row.get(name), row.get(f"{name}_std")
  return "–" if mean is None else f"{cell(mean, digits, scale)} ± {cell(std, digits, scale)}"


def sets_cells(row: dict, value: Value) -> list[str]:
  """A prediction-set row's cells: method, set method, alpha, coverage, mean size, SSCV."""
  return [
    row["label"], row["estimator"], f"{row['alpha']:g}", value(row, "coverage", 3),
    value(row, "mean_size", 2), value(row, "sscv", 3),
  ]  # fmt: skip


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
    *md_head(["model", "method", "alpha", "coverage", "mean size", "SSCV"], 2),
  ]
  return "\n".join(lines + [md_row(sets_cells(r, value)) for r in rows])
