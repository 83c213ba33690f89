"""The standard reliability diagram: confidence against accuracy in equal-mass bins."""

from typing import NamedTuple

import numpy as np
from jax.typing import ArrayLike
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from top1_jax.core import binning, validation
from top1_jax.plots import figures

_POINT_COLOR = "#08519c"  # dark blue: per-bin accuracy
_GAP_COLOR = "#e6550d"  # orange: gap to the diagonal (as the test bars of bin_figure)
_COUNT_COLOR = "#9ecae1"  # light blue: examples per bin (as the calibration bars)


class _BinStats(NamedTuple):
  """The non-empty equal-count bins of a confidence, in ascending order."""

  bins: binning.Bins  # the fitted bins (all slots)
  used: np.ndarray  # [n_bins] bool, slots that hold examples
  lower: np.ndarray  # [B] lowest confidence of each bin's range
  upper: np.ndarray  # [B] highest confidence of each bin's range
  counts: np.ndarray  # [B] examples
  mean_confidence: np.ndarray  # [B]
  accuracy: np.ndarray  # [B]


def _bin_statistics(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> _BinStats:
  bins = binning.fit(confidence, correct, n_bins)
  index = np.asarray(binning.assign(bins.edges, confidence))
  confidence_sums = np.bincount(index, weights=confidence, minlength=bins.n_bins)
  # Tied confidences merge edges; the freed slots (edges = +inf) hold no examples.
  used = np.asarray(bins.counts) > 0
  counts = np.asarray(bins.counts)[used]
  # A bin spans (previous edge, edge]; the outer bins end at the observed extremes
  # (the last bin's edge is a +inf pad when ties were merged).
  top = confidence.max()
  bounds = np.concatenate([[confidence.min()], np.asarray(bins.edges, np.float64), [top]])
  ends = np.flatnonzero(used)
  return _BinStats(
    bins=bins,
    used=used,
    lower=bounds[ends],
    upper=np.minimum(bounds[ends + 1], top),
    counts=counts,
    mean_confidence=confidence_sums[used] / counts,
    accuracy=np.asarray(bins.hits, np.float64)[used] / counts,
  )


def _draw_reliability(ax: Axes, stats: _BinStats, delta: float | None, num: int) -> float:
  """The diagonal, the per-bin accuracies, their gaps and intervals; returns the lowest y."""
  conf, acc, counts = stats.mean_confidence, stats.accuracy, stats.counts
  ece = float(np.sum(counts / num * np.abs(acc - conf)))
  # Which ECE: the one over these bins (after ties), not the benchmark's equal-width one.
  ece_name = f"ECE (equal-mass, {counts.size} bins)"
  lowest = min(conf.min(), acc.min())
  ax.plot([0, 1], [0, 1], color="0.45", linestyle="--", linewidth=1.0, label="perfect calibration")
  # The gap of each bin, drawn from the diagonal, is what the ECE averages.
  ax.vlines(conf, conf, acc, color=_GAP_COLOR, linewidth=2.5, alpha=0.7, label="gap to diagonal")
  if delta is not None:
    lower, upper = (
      np.asarray(b, np.float64)[stats.used]
      for b in binning.confidence_bounds(stats.bins, delta, "clopper_pearson")
    )
    ax.errorbar(
      conf,
      acc,
      yerr=np.stack([np.maximum(acc - lower, 0.0), np.maximum(upper - acc, 0.0)]),
      fmt="none",
      ecolor=_POINT_COLOR,
      elinewidth=0.8,
      capsize=2,
      alpha=0.6,
      label=f"{100 * (1 - delta):g}% Clopper–Pearson interval",
    )
    lowest = min(lowest, lower.min())
  ax.plot(
    conf,
    acc,
    color=_POINT_COLOR,
    marker="o",
    markersize=4.5,
    linewidth=1.2,
    label=f"accuracy per bin; {ece_name} = {ece:.2%}",
  )
  ax.set_ylabel("accuracy in bin")
  ax.grid(alpha=0.3)
  # Over- and underconfident models fill opposite sides of the diagonal.
  ax.legend(loc="best", fontsize="small")
  return lowest


def _draw_counts(ax: Axes, stats: _BinStats, span: float, requested: int) -> None:
  """One bar per bin across its confidence range, as high as its number of examples."""
  # Equal-count bins are narrow where confidences crowd (often near 1); a floor on
  # the drawn width keeps such a bin visible.
  width = np.maximum(stats.upper - stats.lower, 0.004 * span)
  ax.bar(
    stats.lower,
    stats.counts,
    width,
    align="edge",
    color=_COUNT_COLOR,
    edgecolor="white",
    linewidth=0.5,
  )
  counts = stats.counts
  spread = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}–{counts.max()}"
  ax.text(
    0.02,
    0.9,
    f"{figures.bins_phrase(requested, counts.size)}; {spread} examples each (N = {counts.sum()})",
    transform=ax.transAxes,
    va="top",
    fontsize="small",
  )
  ax.set_ylim(0, 1.35 * counts.max())
  ax.set_ylabel("examples")
  ax.set_xlabel("confidence (points: bin mean; bars: bin range)")
  ax.grid(axis="y", alpha=0.3)


def reliability_diagram(
  confidence: ArrayLike,
  correct: ArrayLike,
  n_bins: int = 15,
  *,
  delta: float | None = 0.05,
  title: str | None = "Reliability diagram ({bins})",
) -> Figure:
  """Confidence against accuracy in equal-mass bins, with the bins' counts below.

  The confidences are cut into equal-count bins (``binning.fit``, ties merged);
  each bin is a point at its mean confidence and its accuracy, joined to the
  diagonal of perfect calibration by its gap. The legend gives the ECE of these
  bins, named "ECE (equal-mass, B bins)": sum over the B bins of
  (count / N) |accuracy - mean confidence| (not the benchmarks' equal-width ECE).
  The lower panel has one bar per bin across the bin's confidence range, as high
  as its number of examples. Tied confidences merge bins, so B can be below
  ``n_bins``: the title and the lower panel then say both ("15 equal-mass bins
  requested, 12 after ties").

  Args:
    confidence: [N] predicted P(correct) in [0, 1]: the raw max-softmax, or a
      calibrator's ``predict_confidence``.
    correct: [N] bool, whether each prediction is correct.
    n_bins: number of equal-mass bins requested, 1 <= n_bins <= N.
    delta: draws per-bin ``1 - delta`` Clopper–Pearson intervals of the accuracy;
      None for none.
    title: axes title; "{bins}" in it becomes the requested and effective bin
      counts ("15 equal-mass bins", or "15 equal-mass bins requested, 12 after ties");
      None for none (the lower panel still gives the bin counts).

  Returns:
    A ``Figure`` with two axes sharing the confidence axis: the diagram, the counts.

  Raises:
    ValueError: non-finite or out-of-range confidences, a length mismatch, no
      examples, ``correct`` not 0/1, or ``n_bins`` or ``delta`` out of range.
  """
  confidence, correct = validation.score_and_event(
    "confidence", confidence, correct, probability=True
  )
  confidence, correct = np.asarray(confidence), np.asarray(correct)
  if delta is not None and not 0.0 < delta < 1.0:
    raise ValueError(f"delta: expected a value in (0, 1) or None, got {delta}")
  stats = _bin_statistics(confidence, correct, n_bins)

  fig = figures.new_figure((6.2, 7.0))
  diagram_ax, counts_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
  lowest = _draw_reliability(diagram_ax, stats, delta, confidence.shape[0])
  # Zoom to the points and their intervals (max-softmax never falls below 1 / K, and
  # a few low outliers would squeeze the rest against 100%); the same range on both
  # axes keeps the diagonal at 45 degrees.
  low = max(0.0, np.floor(10 * lowest - 1e-9) / 10 - 0.02)
  diagram_ax.set_xlim(low, 1.01)
  diagram_ax.set_ylim(low, 1.01)
  _draw_counts(counts_ax, stats, 1.01 - low, n_bins)
  for ax in (diagram_ax, counts_ax):
    ax.xaxis.set_major_formatter(ticker.PercentFormatter(1.0, decimals=0))
  diagram_ax.yaxis.set_major_formatter(ticker.PercentFormatter(1.0, decimals=0))
  if title is not None:
    bins = figures.bins_phrase(n_bins, stats.counts.size, "equal-mass")
    diagram_ax.set_title(title.replace("{bins}", bins))
  return fig
