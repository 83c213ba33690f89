"""The reliability diagram: confidence against accuracy in equal-mass or equal-width bins."""

from typing import NamedTuple

import numpy as np
from jax.typing import ArrayLike
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from top1_jax.core import accuracy_bounds, binning, equal_width, metrics, validation
from top1_jax.plots import figures

BINNINGS = ("equal-mass", "equal-width")

_POINT_COLOR = "#08519c"  # dark blue: per-bin accuracy
_GAP_COLOR = "#e6550d"  # orange: gap to the diagonal (as the test bars of bin_figure)
_COUNT_COLOR = "#9ecae1"  # light blue: examples per bin (as the calibration bars)


class _BinStats(NamedTuple):
  """The non-empty bins of a confidence, in ascending order."""

  binning: str  # "equal-mass" or "equal-width"
  requested: int  # bins asked for
  lower: np.ndarray  # [B] lowest confidence of each bin's range
  upper: np.ndarray  # [B] highest confidence of each bin's range
  counts: np.ndarray  # [B] examples
  hits: np.ndarray  # [B] correct ones
  mean_confidence: np.ndarray  # [B]

  @property
  def after_ties(self) -> int | None:
    # Equal-mass bins merge at ties; equal-width bins are fixed intervals, some empty.
    return self.counts.size if self.binning == "equal-mass" else None


def _bin_statistics(confidence, correct, n_bins: int, kind: str) -> _BinStats:
  if kind == "equal-mass":  # quantile edges, ties merged
    bins = binning.fit(confidence, correct, n_bins)
    # A bin spans (previous edge, edge]; the outer bins end at the observed extremes (the
    # freed slots of merged ties have edges +inf, and hold no examples).
    edges = np.asarray(bins.edges, np.float64)
    bounds = np.concatenate([[confidence.min()], np.minimum(edges, confidence.max()), [1.0]])
    index, num_slots = np.asarray(binning.assign(bins.edges, confidence)), bins.n_bins
  else:  # the benchmark's right-closed bins (b / B, (b + 1) / B]
    num_slots = equal_width.checked_n_bins(n_bins)
    index = np.asarray(equal_width.equal_width_index(confidence, num_slots))
    bounds = np.linspace(0.0, 1.0, num_slots + 1)
  counts = np.bincount(index, minlength=num_slots)
  hits = np.bincount(index, weights=correct.astype(np.float64), minlength=num_slots)
  sums = np.bincount(index, weights=confidence.astype(np.float64), minlength=num_slots)
  used = np.flatnonzero(counts > 0)
  upper = np.minimum(bounds[used + 1], confidence.max())
  mean = sums[used] / counts[used]
  return _BinStats(kind, n_bins, bounds[used], upper, counts[used], hits[used], mean)


def _draw_reliability(ax: Axes, stats: _BinStats, delta: float | None, num: int) -> float:
  """The diagonal, the per-bin accuracies, their gaps and intervals; returns the lowest y."""
  conf, acc, counts = stats.mean_confidence, stats.hits / stats.counts, stats.counts
  ece = float(np.sum(counts / num * np.abs(acc - conf)))
  lowest = min(conf.min(), acc.min())
  ax.plot([0, 1], [0, 1], color="0.45", linestyle="--", linewidth=1.0, label="perfect calibration")
  # The gap of each bin, drawn from the diagonal, is what the ECE averages.
  ax.vlines(conf, conf, acc, color=_GAP_COLOR, linewidth=2.5, alpha=0.7, label="gap to diagonal")
  if delta is not None:
    hits = stats.hits.astype(np.int64)
    lower, upper = (
      np.asarray(b, np.float64) for b in accuracy_bounds.clopper_pearson(hits, stats.counts, delta)
    )
    yerr = np.stack([np.maximum(acc - lower, 0.0), np.maximum(upper - acc, 0.0)])
    ax.errorbar(
      conf, acc, yerr=yerr, fmt="none", ecolor=_POINT_COLOR, elinewidth=0.8, capsize=2, alpha=0.6,
      label=f"{100 * (1 - delta):g}% Clopper–Pearson interval",
    )  # fmt: skip
    lowest = min(lowest, lower.min())
  ece_name = metrics.ece_name(stats.requested, stats.binning, stats.after_ties)
  label = f"accuracy per bin; {ece_name} = {ece:.2%}"
  ax.plot(conf, acc, color=_POINT_COLOR, marker="o", markersize=4.5, linewidth=1.2, label=label)
  ax.set_ylabel("accuracy in bin")
  ax.grid(alpha=0.3)
  # Over- and underconfident models fill opposite sides of the diagonal.
  ax.legend(loc="best", fontsize="small")
  return lowest


def _draw_counts(ax: Axes, stats: _BinStats, span: float) -> None:
  """One bar per bin across its confidence range, as high as its number of examples."""
  counts = stats.counts
  # Equal-mass bins are narrow where confidences crowd: a floor on the width keeps them visible.
  width = np.maximum(stats.upper - stats.lower, 0.004 * span)
  ax.bar(stats.lower, counts, width, align="edge", color=_COUNT_COLOR, edgecolor="white", lw=0.5)
  spread = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}–{counts.max()}"
  if stats.binning == "equal-mass":
    bins = metrics.bins_phrase(stats.requested, counts.size)
  else:
    bins = f"{counts.size} of {stats.requested} bins hold examples"
  text = f"{bins}; {spread} examples each (N = {counts.sum()})"
  ax.text(0.02, 0.9, text, transform=ax.transAxes, va="top", fontsize="small")
  ax.set_ylim(0, 1.35 * counts.max())
  ax.set_ylabel("examples")
  ax.set_xlabel("confidence (points: bin mean; bars: bin range)")
  ax.grid(axis="y", alpha=0.3)


def reliability_diagram(
  confidence: ArrayLike,
  correct: ArrayLike,
  n_bins: int = 15,
  *,
  binning: str = "equal-mass",
  delta: float | None = 0.05,
  title: str | None = "Reliability diagram ({bins})",
) -> Figure:
  """Confidence against accuracy in equal-mass or equal-width bins, the counts below.

  Equal-mass bins (``binning.fit``, ties merged) rest every point on as many examples but
  crowd where confidences crowd; equal-width bins (the benchmark's, ``metrics.ece``) spread
  the points, empty ones left out. The legend gives these bins' ECE.

  Args:
    confidence: [N] predicted P(correct) in [0, 1], e.g. the raw max-softmax; ``correct``: [N].
    n_bins: at most N equal-mass or ``equal_width.MAX_EQUAL_WIDTH_BINS`` equal-width bins.
    delta: per-bin ``1 - delta`` Clopper–Pearson intervals of the accuracy; None for none.
    title: "{bins}" becomes the binning and the bin counts; None for none.

  Raises:
    ValueError: non-finite or out-of-range confidences, a length mismatch, no examples,
      ``correct`` not 0/1, or ``n_bins``, ``binning`` or ``delta`` out of range.
  """
  confidence, correct = validation.score_and_event(
    "confidence", confidence, correct, probability=True
  )
  confidence, correct = np.asarray(confidence), np.asarray(correct)
  if binning not in BINNINGS:
    raise ValueError(f"binning: expected one of {BINNINGS}, got {binning!r}")
  if delta is not None and not 0.0 < delta < 1.0:
    raise ValueError(f"delta: expected a value in (0, 1) or None, got {delta}")
  stats = _bin_statistics(confidence, correct, n_bins, binning)

  fig = figures.new_figure((6.2, 7.0))
  diagram_ax, counts_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
  lowest = _draw_reliability(diagram_ax, stats, delta, confidence.shape[0])
  # Zoom to the points and intervals (max-softmax >= 1 / K); equal ranges keep the diagonal 45°.
  low = max(0.0, np.floor(10 * lowest - 1e-9) / 10 - 0.02)
  diagram_ax.set(xlim=(low, 1.01), ylim=(low, 1.01))
  _draw_counts(counts_ax, stats, 1.01 - low)
  for axis in (diagram_ax.xaxis, counts_ax.xaxis, diagram_ax.yaxis):
    axis.set_major_formatter(ticker.PercentFormatter(1.0, decimals=0))
  if title is not None:
    bins = metrics.bins_phrase(n_bins, stats.after_ties, binning)
    diagram_ax.set_title(title.replace("{bins}", bins))
  return fig
