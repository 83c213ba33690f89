"""Bin-count ablation: cross-validated metrics against the number of bins."""

from collections.abc import Mapping, Sequence

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

  Args:
    results: score name -> ``crossval.cross_validate`` result.
    metrics: names from ``crossval.METRICS``, one panel each.
    title: figure title (None for none).

  Returns:
    A ``Figure`` with one axes per metric and one line per score on each.

  Raises:
    ValueError: empty ``results``, a value that is not a ``CrossValidation``, or
      an unknown metric.
  """
  _check_results(results, metrics)
  fig = figures.new_figure((4.6 * len(metrics), 4.2))
  axes = fig.subplots(1, len(metrics), squeeze=False)[0]
  all_bins = sorted({n for result in results.values() for n in result.n_bins})
  colors = [f"C{i % 10}" for i in range(len(results))]
  for ax, metric in zip(axes, metrics, strict=True):
    for color, (name, result) in zip(colors, results.items(), strict=True):
      n_bins = np.asarray(result.n_bins)
      order = np.argsort(n_bins)
      mean = np.asarray(result.mean[metric], np.float64)[order]
      std = np.asarray(result.std[metric], np.float64)[order]
      ax.fill_between(n_bins[order], mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
      ax.plot(n_bins[order], mean, marker="o", markersize=4, color=color, label=name)
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
