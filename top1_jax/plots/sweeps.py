"""Sweeps: cross-validated metrics against the number of bins or the test-time dropout rate."""

import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from top1_jax.core import metrics as metrics_lib
from top1_jax.core import scores, validation
from top1_jax.evaluation import crossval
from top1_jax.plots import figures

# Each metric's (label, which way is better), and those drawn as percentages: every figure's.
METRIC_LABELS = {
  "accuracy": ("Accuracy", "higher is better"),
  "brier": ("Brier score", "lower is better"),
  "brier_uncertainty": ("Brier uncertainty", ""),
  "brier_resolution": ("Brier resolution", "higher is better"),
  "brier_calibration": ("Brier calibration", "lower is better"),
  "nll": ("NLL (nats)", "lower is better"),
  "nll_uncertainty": ("NLL uncertainty (nats)", ""),
  "nll_resolution": ("NLL resolution (nats)", "higher is better"),
  "nll_calibration": ("NLL calibration (nats)", "lower is better"),
  "ece": ("ECE", "lower is better"),
  "eor": ("Expected odds ratio", "higher = more resolution"),
  "auroc": (metrics_lib.BINNED_AUROC_NAME, "higher is better"),
  "num_effective_bins": ("Effective bins", ""),
}
PERCENT_METRICS = ("ece", "accuracy")
_NOTE_WIDTH = 50  # characters of an x-small note per line: a 3.6-inch panel's width
REFERENCE_COLOR = "0.55"  # grey: a reference row (the oracle), not one of the compared lines
# Once the colour cycle is used up, lines differ by dash pattern and marker too.
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")


def check_metrics(metrics) -> None:
  """Refuses anything but a non-empty list of ``crossval.METRICS`` names."""
  if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
    raise ValueError(f"metrics: expected a non-empty list of names, got {metrics!r}")
  for metric in metrics:
    if metric not in crossval.METRICS:
      raise ValueError(f"metrics: expected names among {crossval.METRICS}, got {metric!r}")


def _merge_identical(results: Mapping[str, crossval.CrossValidation]) -> dict:
  """One entry per distinct curve, labelled with every name that gave it: scores that order
  the examples alike (pmax, -log pmax) can give equal curves, the last drawn hiding the rest."""
  groups: list[tuple[list[str], crossval.CrossValidation]] = []
  for name, result in results.items():
    for names, first in groups:
      if (
        tuple(first.n_bins) == tuple(result.n_bins)
        and first.per_fold.keys() == result.per_fold.keys()
        and all(np.array_equal(first.per_fold[m], result.per_fold[m]) for m in first.per_fold)
      ):
        names.append(name)
        break
    else:
      groups.append(([name], result))
  return {_joined_label(names): result for names, result in groups}


def _joined_label(names: list[str]) -> str:
  """'model: pmax = model: -log pmax' -> 'model: pmax = -log pmax' (a shared 'x: ' prefix once)."""
  common = os.path.commonprefix(names)
  prefix = common[: common.rfind(": ") + 2] if ": " in common else ""
  return " = ".join([names[0]] + [name[len(prefix) :] for name in names[1:]])


def _line_styles(num_lines: int) -> list[dict]:
  """Colour, dash pattern and marker of each line: no two alike for up to 4 cycles of colours."""
  colors = mpl.rcParams["axes.prop_cycle"].by_key().get("color") or ["C0"]
  return [
    {
      "color": colors[i % len(colors)],
      "linestyle": _LINESTYLES[(i // len(colors)) % len(_LINESTYLES)],
      "marker": _MARKERS[(i // len(colors)) % len(_MARKERS)],
    }
    for i in range(num_lines)
  ]


def format_panel(ax, metric: str, ece_label: str, sep: str = "\n") -> None:
  """Title (``sep`` before its direction: two lines fit a narrow panel), y label (the ECE's
  is ``ece_label``, naming its bins) and y format of a metric's panel."""
  label, direction = METRIC_LABELS.get(metric, (metric, ""))
  ax.set_title(f"{label}{sep}({direction})" if direction else label)
  ax.set_ylabel(ece_label if metric == "ece" else label)
  if metric in PERCENT_METRICS:
    ax.yaxis.set_major_formatter(ticker.PercentFormatter(1.0))
  ax.grid(alpha=0.3)


def _split_ece(bins: str) -> str:
  # The calibration split's quantile bins, as in results.csv; not Table 1's equal-width ECE.
  return metrics_lib.ece_name(bins, "equal-mass", calibration=True, percent=True)


def _log_axis(ax, ticks: list, xlabel: str, fmt) -> None:
  """A log x axis with a tick at, and only at, each of ``ticks``, labelled ``fmt(tick)``."""
  ax.set(xlabel=xlabel, xscale="log")
  ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
  ax.xaxis.set_major_formatter(ticker.FixedFormatter([fmt(t) for t in ticks]))
  ax.xaxis.set_minor_locator(ticker.NullLocator())


def _curve(result: crossval.CrossValidation, metric: str):
  """(bin counts ascending, the metric's mean, its std over splits) of one result."""
  n_bins = np.asarray(result.n_bins)
  order = np.argsort(n_bins)
  mean = np.asarray(result.mean[metric], np.float64)[order]
  return n_bins[order], mean, np.asarray(result.std[metric], np.float64)[order]


def _ties_note(result: crossval.CrossValidation) -> str:
  """ " (ties: 20→17.2 bins)" where tied scores left fewer bins than requested (split mean)."""
  if "num_effective_bins" not in result.mean:
    return ""
  n_bins, effective, _ = _curve(result, "num_effective_bins")
  fewer = [f"{n}→{e:.3g}" for n, e in zip(n_bins, effective, strict=True) if e < n - 1e-6]
  return f" (ties: {', '.join(fewer)} bins)" if fewer else ""


def _value_text(metric: str, value: float) -> str:
  return f"{value:.2%}" if metric in PERCENT_METRICS else f"{value:.3g}"


def _draw_references(ax, metric: str, references: Mapping[str, crossval.CrossValidation]) -> None:
  """Thin grey lines that leave the axis limits to the compared lines (the oracle can lie far
  from every real score); values off the drawn range are written at that edge."""
  low, high = ax.get_ylim()  # autoscaled to the compared lines and their bands
  notes = {"below": [], "above": []}
  for index, (name, result) in enumerate(references.items()):
    dashes = _LINESTYLES[index % len(_LINESTYLES)]
    x, mean, _ = _curve(result, metric)
    ax.plot(x, mean, color=REFERENCE_COLOR, linewidth=1.0, linestyle=dashes, label=name)
    for side, off in (("below", mean < low), ("above", mean > high)):
      if np.any(off):
        values = mean[off]
        span = _value_text(metric, values.min())
        if values.max() > values.min():
          span += f"–{_value_text(metric, values.max())}"
        note = f"{name}: {span} at {', '.join(map(str, x[off]))} bins (off scale {side})"
        notes[side].append(textwrap.fill(note, _NOTE_WIDTH))  # within a page-wide panel
  ax.set_ylim(low, high)
  for side, y, va in (("below", 0.02, "bottom"), ("above", 0.98, "top")):
    if notes[side]:
      ax.text(
        0.02, y, "\n".join(notes[side]), transform=ax.transAxes, va=va, fontsize="x-small",
        color="0.35", bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
      )  # fmt: skip


def ablation_figure(
  results: Mapping[str, crossval.CrossValidation],
  *,
  references: Mapping[str, crossval.CrossValidation] | None = None,
  metrics: Sequence[str] = ("brier", "ece", "eor"),
  title: str | None = "Scores against the number of bins (mean ± std over splits)",
) -> Figure:
  """Cross-validated metrics against the number of bins, one line per score.

  One panel per metric (``crossval.METRICS``); each line runs through the means with bars of
  ± one std over the splits, shifted a little along x. Scores with equal per-split metrics
  share one line ("a = b"); ties that left fewer bins than requested are noted in the legend.

  Args:
    results: score name -> ``crossval.cross_validate`` result.
    references: label -> result drawn as a thin grey line that does not set the axis
      limits (the oracle, which needs the labels).

  Raises:
    ValueError: empty ``results``, a value that is not a ``CrossValidation``, an unknown metric.
  """
  if not isinstance(results, Mapping) or not results:
    raise ValueError("results: expected a non-empty dict of score name -> CrossValidation")
  references = {} if references is None else references
  validation.instance("references", references, Mapping, "a dict of label -> CrossValidation")
  for what, mapping in (("results", results), ("references", references)):
    for name, result in mapping.items():
      hint = "crossval.CrossValidation"
      validation.instance(f"{what}[{name!r}]", result, crossval.CrossValidation, hint)
  check_metrics(metrics)
  results = _merge_identical(results)
  fig, axes = figures.panel_row(len(metrics))
  all_bins = sorted({n for r in (*results.values(), *references.values()) for n in r.n_bins})
  styles = _line_styles(len(results))
  # Factors that shift each line along the log x axis, so that close lines' error bars stand
  # side by side: a fifth of the narrowest gap between bin counts, at most ±15 %.
  gaps = np.diff(np.log(all_bins))
  half = min(0.1 * float(gaps.min()) if gaps.size else 0.1, 0.14)
  dodge = np.exp(np.linspace(-half, half, len(results))) if len(results) > 1 else np.ones(1)
  for ax, metric in zip(axes, metrics, strict=True):
    for shift, style, (name, result) in zip(dodge, styles, results.items(), strict=True):
      x, mean, std = _curve(result, metric)
      ax.errorbar(shift * x, mean, yerr=std, fmt="none", ecolor=style["color"], elinewidth=1.0)
      ax.plot(shift * x, mean, markersize=4, label=name + _ties_note(result), **style)
    if references:
      _draw_references(ax, metric, references)
    format_panel(ax, metric, _split_ece("N"))
    _log_axis(ax, all_bins, "N: number of bins (requested)", str)
    if len(all_bins) == 1:
      # A log axis around a single point would otherwise span decades of nothing.
      ax.set_xlim(all_bins[0] / 1.5, all_bins[0] * 1.5)
  figures.legend_below(fig, *axes[0].get_legend_handles_labels(), title="uncertainty score")
  if title:
    fig.suptitle(title)
  return fig


# A sweep point's line: what else may differ between rows of one figure besides the rate.
_LINE_COLUMNS = ("dataset", "model", "train_dropout_rate", "num_samples", "seed", "n_bins")
# The deterministic network a line is compared with: the same network, without test-time dropout.
_REFERENCE_COLUMNS = ("dataset", "model", "train_dropout_rate", "seed", "n_bins")


def _line_label(key: tuple, varying: set[str]) -> str:
  """ "10 bins", prefixed with the settings that differ between lines ("cnn, seed 1: 10 bins")."""
  setting = dict(zip(_LINE_COLUMNS, key, strict=True))
  rate = setting["train_dropout_rate"]
  names = {
    "dataset": str(setting["dataset"]),
    "model": str(setting["model"]),
    "train_dropout_rate": f"train dropout {'?' if rate is None else f'{rate:g}'}",
    "num_samples": f"{setting['num_samples']} samples",
    "seed": f"seed {setting['seed']}",
  }
  prefix = [names[c] for c in _LINE_COLUMNS[:-1] if c in varying]
  bins = f"{setting['n_bins']} bins"
  return f"{', '.join(prefix)}: {bins}" if prefix else bins


def _rows_ties_note(points: list, n_bins) -> str:
  """ " requested, 17.2–18 after ties" where a line's rows merged tied bins (split means)."""
  effective = [r["num_effective_bins"] for r in points if r.get("num_effective_bins") is not None]
  if n_bins is None or not effective or min(effective) >= float(n_bins) - 1e-6:
    return ""
  low, high = min(effective), max(effective)
  span = f"{low:.3g}" if high - low < 1e-6 else f"{low:.3g}–{high:.3g}"
  return f" requested, {span} after ties"


def _select(rows, topk: int, estimator: str, score: str | None):
  """(the MC-dropout rows of one score, the deterministic rows of theirs, the two scores)."""
  chosen = [
    r for r in rows if r.get("topk") == topk and (r.get("estimator") or "bins") == estimator
  ]
  mc = [r for r in chosen if r.get("method") == "mc_dropout" and (r.get("dropout_rate") or 0) > 0]
  if not mc:
    raise ValueError(
      f"rows: no mc_dropout rows with a dropout rate > 0 for top-{topk} and estimator "
      f"{estimator!r}: nothing to draw against the dropout rate"
    )
  available = list(dict.fromkeys(r["score"] for r in mc))
  score = score or scores.headline(available)
  if score not in available:
    raise ValueError(f"score: expected one of the MC-dropout rows' {available}, got {score!r}")
  deterministic = [r for r in chosen if r.get("method") == "deterministic"]
  reference_score = scores.headline(dict.fromkeys(r["score"] for r in deterministic))
  deterministic = [r for r in deterministic if r["score"] == reference_score]
  return [r for r in mc if r["score"] == score], deterministic, score, reference_score


def _reference_key(line_key: tuple) -> tuple:
  return tuple(line_key[_LINE_COLUMNS.index(c)] for c in _REFERENCE_COLUMNS)


def dropout_rate_figure(
  rows: Sequence[Mapping[str, Any]],
  *,
  topk: int = 1,
  score: str | None = None,
  metrics: Sequence[str] = ("brier", "ece", "auroc"),
  estimator: str = "bins",
  title: str | None = "MC dropout, {score}, top-{topk}: metrics against the dropout rate",
) -> Figure:
  """Metrics of MC dropout against the test-time dropout rate, one line per bin count.

  Points are the rows' ``<metric>`` with error bars of ``<metric>_std``; the deterministic
  network each line samples is a dotted line in its colour. Rows that mix models, training
  rates, sample counts or seeds give a line per mix, named by what differs.

  Args:
    rows: tidy rows (``results.csv`` or ``aggregate.csv``), None where undefined.
    score: the MC-dropout rows' score; default ``scores.headline``.
    estimator: the estimator of P(correct | U) drawn (``crossval.ESTIMATORS``).

  Raises:
    ValueError: no MC-dropout rows with a rate > 0 for ``topk`` and ``estimator``
      (callers skip the figure), a score they do not hold, or an unknown metric.
  """
  check_metrics(metrics)
  if isinstance(rows, (str, Mapping)) or not all(isinstance(r, Mapping) for r in rows):
    raise ValueError("rows: expected a list of dicts (tidy results rows)")
  mc, deterministic, score, reference_score = _select(rows, topk, estimator, score)
  lines: dict[tuple, list] = {}
  for row in mc:
    lines.setdefault(tuple(row.get(c) for c in _LINE_COLUMNS), []).append(row)
  # Lines of one network together, by bin count (None sorts as text, not against numbers).
  lines = dict(sorted(lines.items(), key=lambda item: (str(item[0][:-1]), item[0][-1])))
  references = {tuple(r.get(c) for c in _REFERENCE_COLUMNS): r for r in deterministic}
  varying = {c for i, c in enumerate(_LINE_COLUMNS) if len({key[i] for key in lines}) > 1}
  labels = [_line_label(key, varying) + _rows_ties_note(lines[key], key[-1]) for key in lines]
  fig, axes = figures.panel_row(len(metrics))
  rates = sorted({r["dropout_rate"] for r in mc})
  styles = _line_styles(len(lines))
  for ax, metric in zip(axes, metrics, strict=True):
    for style, label, (key, points) in zip(styles, labels, lines.items(), strict=True):
      points = sorted(points, key=lambda r: r["dropout_rate"])
      x = [r["dropout_rate"] for r in points]
      mean = [np.nan if r.get(metric) is None else r[metric] for r in points]
      std = [r.get(f"{metric}_std") or 0.0 for r in points]
      ax.errorbar(x, mean, yerr=std, capsize=3, markersize=4, label=label, **style)
      reference = references.get(_reference_key(key))
      if reference is not None and reference.get(metric) is not None:
        ax.axhline(reference[metric], color=style["color"], linestyle=":", linewidth=1.2)
    format_panel(ax, metric, _split_ece("each line's"))
    _log_axis(ax, rates, "test-time dropout rate", "{:g}".format)
    ax.set_xlim(min(rates) / 1.5, max(rates) * 1.5)
  handles, labels = axes[0].get_legend_handles_labels()
  if any(_reference_key(key) in references for key in lines):
    handles.append(Line2D([], [], color="grey", linestyle=":", linewidth=1.2))
    labels.append(f"deterministic ({scores.label(reference_score)})")
  figures.legend_below(fig, handles, labels)
  if title:
    fig.suptitle(title.format(score=scores.label(score), topk=topk))
  return fig
