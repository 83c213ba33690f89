"""The risk-coverage curve of a score, with selective prediction's guaranteed operating points."""

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

from top1_jax.core import validation
from top1_jax.evaluation import selective
from top1_jax.plots import figures

_CURVE_COLOR = "#08519c"  # dark blue, as the reliability diagram's points
_POINT_COLORS = ("#e6550d", "#31a354", "#756bb1", "#636363")
_BAR_HALF_WIDTH = 0.04  # the guarantee's bar: ±4 % of coverage around its point
_BAR_WIDTH = 3.0  # points
GUARANTEE_LABEL = "short bar at its coverage: guaranteed risk, 1 − bound"


class OperatingPoint(NamedTuple):
  """One selection's outcome on the examples of the curve."""

  target: float  # the accuracy the selection was asked to guarantee
  coverage: float  # the fraction of the examples it answered
  accuracy: float | None  # theirs; None when it answered none
  guaranteed_accuracy: float | None  # its lower bound; None when it selected no bin


def _defined(value: float | None) -> bool:
  return value is not None and math.isfinite(value)


def risk_coverage_figure(
  curve: selective.RiskCoverage,
  points: Sequence[OperatingPoint] = (),
  *,
  title: str | None = None,
) -> Figure:
  """Risk (error rate) against coverage (``selective.risk_coverage``), each selection marked.

  A point is drawn at its coverage and risk, with a dashed line at its target risk and a
  short thick bar at its guaranteed risk: the two lie close, so they differ in style and
  extent. A selection that answered nothing is listed in the legend only.
  """
  validation.instance("curve", curve, selective.RiskCoverage, "selective.RiskCoverage")
  coverage, risk = np.asarray(curve.coverage), np.asarray(curve.risk)
  fig = figures.new_figure((6.2, 4.6))
  ax = fig.subplots()
  ax.plot(coverage, risk, color=_CURVE_COLOR, lw=1.5, label="risk among the most confident")
  for index, point in enumerate(points):
    color = _POINT_COLORS[index % len(_POINT_COLORS)]
    label = f"target {point.target:g}"
    ax.axhline(1 - point.target, color=color, ls="--", lw=1.0)
    if not _defined(point.accuracy):
      ax.plot([], [], "o", color=color, label=f"{label}: nothing selected")
      continue
    if _defined(point.guaranteed_accuracy):
      ceiling = 1 - point.guaranteed_accuracy
      bar = [point.coverage - _BAR_HALF_WIDTH, point.coverage + _BAR_HALF_WIDTH]
      ax.plot(bar, [ceiling, ceiling], color=color, ls="-", lw=_BAR_WIDTH, solid_capstyle="butt")
      label += f", guaranteed ≥ {point.guaranteed_accuracy:.3f}"
    label += f": coverage {point.coverage:.1%}"
    ax.plot([point.coverage], [1 - point.accuracy], "o", color=color, ms=7, label=label)
  # Every line style in the legend: the dashes and dots of each colour, once.
  if points:
    ax.plot([], [], color="0.3", ls="--", lw=1.0, label="dashed line: target risk, 1 − target")
  if any(_defined(p.accuracy) and _defined(p.guaranteed_accuracy) for p in points):
    ax.plot([], [], color="0.3", ls="-", lw=_BAR_WIDTH, label=GUARANTEE_LABEL)
  ax.set(xlim=(0, 1.01), ylim=(0, max(float(np.max(risk, initial=0.0)) * 1.1, 0.02)))
  for axis in (ax.xaxis, ax.yaxis):
    axis.set_major_formatter(ticker.PercentFormatter(1.0, decimals=0))
  ax.set_xlabel("coverage (fraction answered, most confident first)")
  ax.set_ylabel("risk (error rate of the answered)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="upper left")
  ax.set_title(title or "Risk-coverage curve")
  return fig
