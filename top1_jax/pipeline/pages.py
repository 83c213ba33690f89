"""What each stage's results page (``index.html``) shows: the answer first (Table 1's raw ->
binned Top-1 Brier and ECE, the best row), then, folded, every table, the figures, the config
and the timings. ``plots.page`` renders it; this module only picks and formats.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from top1_jax.core import metrics, scores
from top1_jax.io import files
from top1_jax.io import results as results_io
from top1_jax.pipeline import runs, shift_tables, tables
from top1_jax.pipeline.settings import Settings
from top1_jax.plots import page  # matplotlib: this module is imported only to write a page

_GROUP_STARTS = {  # the first field of each group of ``Settings``' fields
  "dataset": "data", "models": "training", "dropout_rates": "prediction", "inputs": "inputs",
  "scores": "sweep", "shift_examples": "shift",
}  # fmt: skip
# The sweep fields the shift protocol reads.
_SHIFT_SWEEP = ("n_bins", "compare_bins", "scores", "n_folds", "scheme", "figures")


def _field_groups() -> dict[str, list[str]]:
  groups, group = {}, None
  for field in dataclasses.fields(Settings):
    group = _GROUP_STARTS.get(field.name, group)
    if field.name != "config":
      groups.setdefault(group, []).append(field.name)
  return groups


def config_fields(settings: Settings, stage: str) -> list[str]:
  """The config fields a run of ``stage`` ("evaluate" or "shift") used, in config order."""
  groups = _field_groups()
  if settings.inputs:
    names = ["dataset", "seeds", "inputs", "input_kind"]
    names += ["labels"] if settings.single_input else []
  else:
    names = groups["data"] + groups["training"] + groups["prediction"]
  if stage == "evaluate":
    names += groups["sweep"]
    names += ["shift_estimators", "shift_inputs"] if settings.shift_inputs else []
  elif settings.inputs:  # the shift protocol on a user's shifted files
    names += [*_SHIFT_SWEEP, "shift_estimators", "shift_inputs"]
  else:
    names += [*_SHIFT_SWEEP, *(f for f in groups["shift"] if f != "shift_inputs")]
  order = [name for fields in groups.values() for name in fields]
  return sorted(set(names), key=order.index)


def _config(folder, settings: Settings, stage: str) -> dict[str, Any]:
  """The command (config.json's, else the parent work dir's) and the run's config fields."""
  record = files.read_json(folder / "config.json") or files.read_json(folder.parent / "config.json")
  config = runs.config_json(settings)
  fields = {name: config[name] for name in config_fields(settings, stage) if name in config}
  return {"command": (record or {}).get("command", ""), **fields}


def _ece(n_bins: int | str, binning: str = "equal-mass", **kind) -> str:
  calibration = binning == "equal-mass"
  return metrics.ece_name(n_bins, binning, calibration=calibration, percent=True, **kind)


_NOT_THE_FILE = ("seed", "source", "score", "topk", "estimator", "n_bins")
_FILE_SETTINGS = tuple(c for c in results_io.COLUMNS if c not in _NOT_THE_FILE)


def _file(row: Mapping[str, Any]) -> Any:
  """A row's predictions file: its ``source``, or its settings across merged runs."""
  source = row.get("source")
  return source if source is not None else tuple(row.get(column) for column in _FILE_SETTINGS)


def answer_table(comparison: Sequence[Mapping], accuracy: Mapping[str, str], value) -> Any:
  """Raw -> binned per classifier (Table 1's rows): Top-1 Brier and both named ECEs."""
  if not comparison:
    return None
  first = comparison[0]
  raw_ece, binned_ece = _ece(first["ece_bins"], "equal-width"), _ece(first["top1_n_bins"])
  header = ["classifier", "Top-1 accuracy", "binned score", "Top-1 Brier: raw → binned"]
  header += [f"{raw_ece}: raw", f"{binned_ece}: binned"]
  rows = []
  for r in comparison:
    method, score, _, raw, binned, raw_ece, binned_ece = tables.comparison_cells(r, value)
    score += " per predicted class" if r.get("top1_estimator") == "toplabel" else ""
    accuracy_cell = accuracy.get(_file(r), "–")
    rows.append([method, accuracy_cell, score, f"{raw} → {binned}", raw_ece, binned_ece])
  note = (
    "Raw: the max softmax probability as P(correct) (after the fitted temperature T where "
    f"named); binned: {first['top1_n_bins']} Top-1 bins of the binned score, fitted on each "
    "calibration part. The two ECEs bin differently, as their names say; the Brier score "
    "needs no bins, so it compares raw and binned like for like." + _top_label_note(comparison)
  )
  return page.Table("Raw → calibrated, Top-1", header, rows, note)


def _top_label_note(comparison: Sequence[Mapping]) -> str:
  if not any(r.get("top1_estimator") == "toplabel" for r in comparison):
    return ""
  name = metrics.ece_name(comparison[0]["ece_bins"], "equal-width")
  return f" † Top-label binning's ECE is its P(correct)'s {name}: its bins are per class."


def best_line(rows: Sequence[Mapping], value, comparison: Sequence[Mapping] = ()) -> str:
  """The sweep's best Top-1 row by Brier (the oracle, which needs labels, left out)."""
  top1 = [r for r in rows if r["topk"] == min(x["topk"] for x in rows) and r["brier"] is not None]
  top1 = [r for r in top1 if not scores.needs_labels(r["score"])]
  if not top1:
    return ""
  best = min(top1, key=lambda r: r["brier"])
  line = (
    f"Best Top-{best['topk']} Brier of the sweep: {best['label']}, {tables.score_cell(best)}, "
    f"{best['n_bins']} bins: {value(best, 'brier', 4, 1.0)}"
  )
  raw = [c for c in comparison if _file(c) == _file(best) and c["variant"] == "raw"]
  if raw:
    line += f" (its raw max-softmax: {value(raw[0], 'raw_top1_brier', 4, 1.0)})"
  ece = _ece(best["n_bins"], effective=best.get("num_effective_bins"))
  auroc = f"{metrics.BINNED_AUROC_NAME}: {value(best, 'auroc', 3, 1.0)}"
  return f"{line}; {ece}: {value(best, 'ece', 2, 100.0)}; {auroc}."


def sweep_tables(rows: Sequence[Mapping], value) -> list:
  """Every row of the sweep, one table per Top-k event, bin counts side by side."""
  merged = any("num_runs" in r for r in rows)
  header = ["method", "score", "N", *tables.metric_names("N")]
  header += ["runs"] if merged else ["bins after ties"]
  out = []
  for k in sorted({r["topk"] for r in rows}):
    body = []
    for r in (r for r in rows if r["topk"] == k):  # the sweep's order: file, score, bins
      last = str(r["num_runs"]) if merged else tables.cell(r.get("num_effective_bins"), 1)
      cells = tables.metric_cells(r, value)
      body.append([r["label"], tables.score_cell(r), str(r["n_bins"]), *cells, last])
    out.append(page.Table(f"Top-{k}: every score and bin count (N bins)", header, body))
  return out


def comparison_table(comparison: Sequence[Mapping], value) -> Any:
  """The paper's Table 1 in full: the benchmark's metrics beside Top-1 binning's."""
  if not comparison:
    return None
  first = comparison[0]
  header = ["method", "binned score", "multiclass Brier (benchmark)", "Top-1 Brier: raw pmax"]
  header += ["Top-1 Brier: binned", f"{_ece(first['ece_bins'], 'equal-width')}: raw pmax"]
  header += [f"{_ece(first['top1_n_bins'])}: binned"]
  body = [tables.comparison_cells(r, value) for r in comparison]
  note = tables.COMPARISON_NOTE.replace("*", "") + _top_label_note(comparison)  # no Markdown
  return page.Table("Benchmark metrics vs Top-1 binning (paper Table 1)", header, body, note)


def selective_table(selective: Sequence[Mapping], value) -> Any:
  """Selective prediction with a guarantee: one row per (file, target accuracy)."""
  if not selective:
    return None
  header = ["method", "score", "target", "guaranteed accuracy", "test coverage (%)"]
  header += ["test accuracy", "splits: nothing selected", "splits: test accuracy < target"]
  body = [tables.selective_cells(r, value) for r in selective]
  note = (
    f"{selective[0]['n_bins']} bins of each file's headline score; the most confident bins "
    f"whose accuracy is at least the target with probability {1 - selective[0]['delta']:g}."
  )
  return page.Table("Selective prediction with a guarantee", header, body, note)


def sets_table(rows: Sequence[Mapping], value) -> Any:
  """Prediction sets with a coverage guarantee: one row per (file, method, alpha)."""
  if not rows:
    return None
  header = ["method", "set method", "alpha", "coverage", "mean set size", "SSCV"]
  body = [tables.sets_cells(r, value) for r in rows]
  note = (
    "Split conformal sets fitted on each calibration part, scored on its test part: the "
    "share of labels in their set (>= 1 - alpha by construction), the mean size, and the "
    "size-stratified coverage violation (0 is ideal). topk: the paper's calibrated Top-k."
  )
  return page.Table("Prediction sets with a coverage guarantee", header, body, note)


_RUN_FILES = ("results.md", "results.csv", "results.json", "config.json", "timings.json")
_SHIFT_FILES = ("results.md", "results.csv", "ood.csv", "results.json")


def _present(folder, names: Sequence[str]) -> list[str]:
  return [name for name in names if (folder / name).exists()]


def _sections(rows, comparison, selective, set_rows, value, accuracy_value) -> dict:
  """A sweep page's answer, finding and folded tables (those with rows)."""
  answer = answer_table(comparison, _accuracy(rows, accuracy_value), value)
  details = [
    *sweep_tables(rows, value),
    comparison_table(comparison, value),
    selective_table(selective, value),
    sets_table(set_rows, value),
  ]
  return {
    "answer": [answer] if answer else [],
    "findings": [best_line(rows, value, comparison)],
    "details": [t for t in details if t],
  }


def _accuracy(rows: Sequence[Mapping], value) -> dict[Any, str]:
  """Each file's Top-1 accuracy (mean over its test parts; its first row's), by ``_file``."""
  return {_file(r): value(r, "accuracy", 4, 1.0) for r in reversed(rows) if r["topk"] == 1}


def write_run_page(settings: Settings, workdir, timings: Mapping[str, Any]):
  """index.html of an evaluate stage's work dir, from its results.json; returns its path."""
  data = files.read_json(workdir / "results.json")
  rows, comparison = data["results"], data.get("comparison") or []
  config = data["config"]
  dataset = next((r["dataset"] for r in rows if r.get("dataset")), "predictions")
  num = len(config.get("inputs") or [])
  intro = (
    f"{num} predictions file{'s' if num != 1 else ''} on {config['n_folds']} {config['scheme']} "
    f"calibration/test splits (seed {config['seed']}): each method is fitted on the "
    "calibration part and scored on the test part; every number is a mean over the splits."
  )
  selective, set_rows = data.get("selective") or [], data.get("sets") or []
  sections = _sections(rows, comparison, selective, set_rows, tables.mean_std, tables.run_value)
  return page.write_results_page(
    workdir, f"Calibrated Top-k bins: {dataset}", intro=intro, **sections,
    figures=None if settings.figures else [], config=_config(workdir, settings, "evaluate"),
    timings=timings, links=_present(workdir, _RUN_FILES),
  )  # fmt: skip


def write_aggregate_page(out, title: str, merged: Mapping[str, Sequence], inputs, figures, value):
  """index.html of merged runs: ``merged`` holds their labelled ``rows``, ``comparison``
  and ``selective`` rows, ``value`` formats a merged cell."""
  rows, comparison = merged["rows"], merged.get("comparison") or []
  set_rows = [r for r in rows if r.get("alpha") is not None]  # prediction sets'
  rows = [r for r in rows if r.get("alpha") is None]
  sections = _sections(rows, comparison, merged.get("selective") or [], set_rows, value, value)
  return page.write_results_page(
    out, title, intro=tables.ACROSS_RUNS, **sections, figures=figures,
    config={"inputs": inputs["inputs"], "num_runs": inputs["num_runs"]},
    links=_present(out, ("aggregate.md", "aggregate.csv", "aggregate.json")),
  )  # fmt: skip


def _of(rows, selector, metric: str, clean: bool) -> list:
  """``metric`` of a variant's rows: on the clean set, or on every shifted set."""
  is_clean = lambda r: r["shift"] == results_io.CLEAN
  return [r.get(metric) for r in rows if is_clean(r) == clean and shift_tables.matches(r, selector)]


def _shifted_mean(rows, selector, metric: str) -> float | None:
  values = [v for v in _of(rows, selector, metric, False) if v is not None and math.isfinite(v)]
  return float(np.mean(values)) if values else None


def shift_answer(rows: Sequence[Mapping], n_bins: int, title: str) -> tuple[Any, str]:
  """Per variant: accuracy, Brier and ECE clean and their means over the shifted sets; and
  the line naming the lowest mean Brier under shift."""
  header = ["method", "accuracy (%): clean → shifted", "Brier: clean → shifted"]
  header += [f"{_ece(n_bins)}: clean → shifted"]
  body, shifted_brier = [], {}
  for label, selector in shift_tables.present_variants(rows, n_bins).items():
    cells = [label]
    for metric in ("accuracy", "brier", "ece"):
      scale, digits = shift_tables.metric_format(metric)
      clean = (_of(rows, selector, metric, True) or [None])[0]
      shifted = _shifted_mean(rows, selector, metric)
      cells.append(f"{tables.cell(clean, digits, scale)} → {tables.cell(shifted, digits, scale)}")
    shifted_brier[label] = _shifted_mean(rows, selector, "brier")
    body.append(cells)
  note = "Shifted: the mean over every shifted set (each shift at each intensity), OOD sets aside."
  ranked = {k: v for k, v in shifted_brier.items() if v is not None}
  best = min(ranked, key=ranked.get) if ranked else None
  line = f"{title}: lowest mean Brier under shift: {best} ({ranked[best]:.4f})." if best else ""
  return page.Table(f"{title}: clean → under shift", header, body, note), line


def _by_set(rows: Sequence[Mapping], n_bins: int, metric: str, title: str) -> Any:
  """Every shifted set (rows) by variant (columns), of one metric."""
  variants = shift_tables.present_variants(rows, n_bins)
  scale, digits = shift_tables.metric_format(metric)
  body = []
  for where in dict.fromkeys((r["shift"], r["severity"]) for r in rows):
    at = [r for r in rows if (r["shift"], r["severity"]) == where]
    cells = [where[0], f"{where[1]:g}"]
    for selector in variants.values():
      found = [r.get(metric) for r in at if shift_tables.matches(r, selector)]
      cells.append(tables.cell((found or [None])[0], digits, scale))
    body.append(cells)
  name = shift_tables.metric_title(metric, n_bins)
  return page.Table(f"{title}: {name} of every set", ["shift", "intensity", *variants], body)


def write_shift_page(settings: Settings, folder, timings: Mapping[str, Any]):
  """index.html of the shift protocol's folder, from its results.json; returns its path."""
  data = files.read_json(folder / "results.json")
  n_bins = settings.compare_bins
  answers, findings, details = [], [], []
  for key, rows in shift_tables.grouped(data["results"]).items():
    dataset, model, rate, seed = key
    title = f"{dataset or 'predictions'}, {model or 'model'}"
    title += f", train dropout {rate:g}" if rate is not None else ""
    title += f", seed {seed}" if seed is not None else ""
    table, line = shift_answer(rows, n_bins, title)
    answers.append(table)
    findings.append(line)
    details += [_by_set(rows, n_bins, metric, title) for metric in ("brier", "ece", "accuracy")]
  intro = (
    f"Every method is fitted on the clean calibration part of each of {settings.n_folds} "
    f"{settings.scheme} splits and applied unchanged to the test part of every set, the same "
    "examples shifted; means over the splits."
  )
  return page.write_results_page(
    folder, "Calibration under dataset shift", intro=intro, answer=answers,
    findings=[line for line in findings if line], details=details,
    figures=None if settings.figures else [], config=_config(folder, settings, "shift"),
    timings=timings, links=_present(folder, _SHIFT_FILES),
  )  # fmt: skip
