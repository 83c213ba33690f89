"""Bin-count ablation: cross-validated metrics against the number of bins."""

import os
from collections.abc import Mapping, Sequence

import matplotlib as mpl
import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

from top1_jax import crossval
from top1_jax.plots import figures

_METRIC_LABELS = {
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
  "auroc": ("AUROC", "higher is better"),
  "num_effective_bins": ("Effective bins", ""),
}
_PERCENT_METRICS = ("ece", "accuracy")
# Once the colour cycle is used up, lines differ by dash pattern and marker too.
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")


def _check_results(results, metrics) -> None:
  if not isinstance(results, Mapping) or not results:
    raise ValueError("results: expected a non-empty dict of score name -> CrossValidation")
  for name, result in results.items():
    if not isinstance(result, crossval.CrossValidation):
      raise ValueError(
        f"results[{name!r}]: expected crossval.CrossValidation, got {type(result).__name__}"
      )
  if isinstance(metrics, str) or not metrics:
    raise ValueError(f"metrics: expected a non-empty list of names, got {metrics!r}")
  for metric in metrics:
    if metric not in crossval.METRICS:
      raise ValueError(f"metrics: expected one of {crossval.METRICS}, got {metric!r}")


def _merge_identical(
  results: Mapping[str, crossval.CrossValidation],
) -> dict[str, crossval.CrossValidation]:
  """One entry per distinct curve, labelled with every name that gave it.

  Scores that order the examples the same way (pmax and -log pmax) can give the
  same bins and so the same per-split metrics; their lines would lie on top of
  each other, and the one drawn last would hide the other.
  """
  groups: list[tuple[list[str], crossval.CrossValidation]] = []
  for name, result in results.items():
    for names, first in groups:
      if _same_curve(first, result):
        names.append(name)
        break
    else:
      groups.append(([name], result))
  return {_joined_label(names): result for names, result in groups}


def _same_curve(a: crossval.CrossValidation, b: crossval.CrossValidation) -> bool:
  return (
    tuple(a.n_bins) == tuple(b.n_bins)
    and a.per_fold.keys() == b.per_fold.keys()
    and all(np.array_equal(a.per_fold[m], b.per_fold[m]) for m in a.per_fold)
  )


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


def _format_bin_axis(ax, all_bins: list[int]) -> None:
  """A log x axis with a tick at, and only at, each bin count of the sweep."""
  ax.set_xlabel("number of bins")
  ax.set_xscale("log")
  ax.xaxis.set_major_locator(ticker.FixedLocator(all_bins))
  ax.xaxis.set_major_formatter(ticker.FixedFormatter([str(n) for n in all_bins]))
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  if len(all_bins) == 1:
    # A log axis around a single point would otherwise span decades of nothing.
    ax.set_xlim(all_bins[0] / 1.5, all_bins[0] * 1.5)


def ablation_figure(
  results: Mapping[str, crossval.CrossValidation],
  *,
  metrics: Sequence[str] = ("brier", "ece", "eor"),
  title: str | None = "Scores against the number of bins (mean ± std over splits)",
) -> Figure:
  """Cross-validated metrics against the number of bins, one line per score.

  One panel per metric, log x axis at the bin counts; each score is a line
  through the means with a band of ± one standard deviation over the splits.
  Scores whose per-split metrics are exactly equal (the same bins, e.g. two
  scores that order the examples identically) share one line, labelled
  "a = b". Past the colour cycle, lines also differ by dash pattern and marker.

  Args:
    results: score name -> ``crossval.cross_validate`` result.
    metrics: names from ``crossval.METRICS``, one panel each.
    title: figure title (None for none).

  Returns:
    A ``Figure`` with one axes per metric and one line per distinct curve on each.

  Raises:
    ValueError: empty ``results``, a value that is not a ``CrossValidation``, or
      an unknown metric.
  """
  _check_results(results, metrics)
  results = _merge_identical(results)
  fig = figures.new_figure((4.6 * len(metrics), 4.2))
  axes = fig.subplots(1, len(metrics), squeeze=False)[0]
  all_bins = sorted({n for result in results.values() for n in result.n_bins})
  styles = _line_styles(len(results))
  for ax, metric in zip(axes, metrics, strict=True):
    for style, (name, result) in zip(styles, results.items(), strict=True):
      n_bins = np.asarray(result.n_bins)
      order = np.argsort(n_bins)
      mean = np.asarray(result.mean[metric], np.float64)[order]
      std = np.asarray(result.std[metric], np.float64)[order]
      x = n_bins[order]
      ax.fill_between(x, mean - std, mean + std, color=style["color"], alpha=0.15, linewidth=0)
      ax.plot(x, mean, markersize=4, label=name, **style)
    label, direction = _METRIC_LABELS.get(metric, (metric, ""))
    ax.set_title(f"{label} ({direction})" if direction else label)
    ax.set_ylabel(label)
    _format_bin_axis(ax, all_bins)
    if metric in _PERCENT_METRICS:
      ax.yaxis.set_major_formatter(ticker.PercentFormatter(1.0))
    ax.grid(alpha=0.3)
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(
    handles,
    labels,
    loc="outside lower center",
    ncols=min(len(labels), 5),
    title="uncertainty score",
    fontsize="small",
  )
  if title:
    fig.suptitle(title)
  return fig
