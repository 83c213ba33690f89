"""Per-bin figures: calibration and test bins of one score (paper Figs. 1 and 2)."""

from typing import NamedTuple

import numpy as np
from matplotlib import offsetbox, ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from top1_jax.core import binning, validation
from top1_jax.core import metrics as metrics_lib
from top1_jax.plots import figures

BOUNDS = ("clopper_pearson", "hoeffding")
BAR_ORDERS = ("prob", "bins")

_BOUND_NAMES = {"clopper_pearson": "Clopper–Pearson", "hoeffding": "Hoeffding"}
_TRAIN_COLOR = "#9ecae1"  # light blue: calibration (train) bins
_TEST_COLOR = "#e6550d"  # orange: test bins
_INTERVAL_COLOR = "#08306b"  # dark blue: intervals and their annotation


def _check_pair(train_bins, test_bins, name: str = "") -> None:
  """Checks a (calibration, test) pair; ``name`` prefixes messages for tuple arguments."""
  train_name, test_name = (f"{name}[0]", f"{name}[1]") if name else ("train_bins", "test_bins")
  for where, bins in ((train_name, train_bins), (test_name, test_bins)):
    validation.instance(where, bins, binning.Bins, "binning.Bins")
    counts = np.shape(bins.counts)
    if len(counts) != 1 or np.shape(bins.hits) != counts or np.shape(bins.prob) != counts:
      raise ValueError(
        f"{where}: expected 1-D counts, hits and prob of one shape (one binning, not a batch),"
        f" got {counts}, {np.shape(bins.hits)}, {np.shape(bins.prob)}"
      )
    if int(np.sum(np.asarray(bins.counts))) <= 0:  # np.sum of a jax array would compile one
      raise ValueError(f"{where}: no examples were counted in any bin")
  refit = "(count the test split with binning.refit(train_bins, ...))"
  if train_bins.n_bins != test_bins.n_bins:
    got = f"got {test_bins.n_bins} {refit}"
    raise ValueError(f"{test_name}: expected {train_bins.n_bins} bins like {train_name}, {got}")
  if not np.array_equal(np.asarray(train_bins.edges), np.asarray(test_bins.edges)):
    raise ValueError(f"{test_name}: bin edges differ from {train_name}'s {refit}")


def _check_options(accuracy, delta, bounds, order: str = "prob") -> tuple[float | None, float]:
  if accuracy is not None:
    try:
      accuracy = float(accuracy)
    except (TypeError, ValueError):
      raise ValueError(f"accuracy: expected a number, got {accuracy!r}") from None
    validation.in_range("accuracy", accuracy, 0.0, 1.0)
  delta = validation.probability("delta", delta)
  for name, value, choices in (("bounds", bounds, (*BOUNDS, None)), ("order", order, BAR_ORDERS)):
    if value not in choices:
      raise ValueError(f"{name}: expected one of {choices}, got {value!r}")
  return accuracy, delta


class _Layout(NamedTuple):
  index: np.ndarray  # [B] bin indices with calibration examples, in plotting order
  left: np.ndarray  # [B] left edge on the [0, 1] axis
  width: np.ndarray  # [B] calibration weight of the bin
  prob: np.ndarray  # [B] predicted P(correct) of the bin


def _layout(train_bins: binning.Bins, order: str) -> _Layout:
  counts = np.asarray(train_bins.counts, np.float64)
  prob = np.asarray(train_bins.prob, np.float64)
  index = np.flatnonzero(counts > 0)  # padding slots and merged tie groups hold no data
  if order == "prob":
    index = index[np.argsort(-prob[index], kind="stable")]
  width = counts[index] / counts.sum()
  left = np.concatenate([[0.0], np.cumsum(width)[:-1]])
  return _Layout(index, left, width, prob[index])


def _confidence(delta: float) -> str:
  """1 - delta as a percentage with the digits it needs: 95%, 99.5%."""
  percent = 100 * (1 - delta)
  digits = next((d for d in range(3) if abs(float(f"{percent:.{d}f}") - percent) < 1e-9), 3)
  return f"{percent:.{digits}f}%"


def _draw_intervals(ax: Axes, train_bins, layout: _Layout, delta: float, bounds: str):
  """Draws the per-bin intervals as error bars; returns (lower, upper)."""
  lower, upper = (
    np.asarray(b, np.float64)[layout.index]
    for b in binning.confidence_bounds(train_bins, delta, bounds)
  )
  # Clipped: the interval is around hits / counts, the prediction (with its prior) a hair off.
  yerr = np.stack([np.maximum(layout.prob - lower, 0.0), np.maximum(upper - layout.prob, 0.0)])
  many = layout.index.size > 30
  ax.errorbar(
    layout.left + layout.width / 2, layout.prob, yerr=yerr, fmt="none", ecolor=_INTERVAL_COLOR,
    alpha=0.55 if many else 1.0, elinewidth=0.6 if many else 1.0, capsize=0 if many else 3,
    label=f"{_confidence(delta)} {_BOUND_NAMES[bounds]} interval",
  )  # fmt: skip
  return lower, upper


def _draw_bins(ax, train_bins, test_bins, accuracy, delta, bounds, order, annotate, event, title):
  """``bin_figure``'s drawing into ``ax``, of checked arguments."""
  layout = _layout(train_bins, order)
  baseline = accuracy
  if accuracy is None:
    hits, counts = np.sum(np.asarray(test_bins.hits)), np.sum(np.asarray(test_bins.counts))
    baseline = float(hits) / float(counts)
  ece = metrics_lib.binned_ece(train_bins, test_bins)
  # The calibration split's equal-mass bins in use (not the benchmark's equal-width ones).
  ece_name = metrics_lib.ece_name(
    train_bins.n_bins, "equal-mass", layout.index.size, calibration=True
  )
  prob = layout.prob
  test_counts = np.asarray(test_bins.counts)[layout.index]
  test_hits = np.asarray(test_bins.hits, np.float64)[layout.index]

  # White gaps between many thin bars would hide the bars themselves.
  edge = _TRAIN_COLOR if layout.index.size > 30 else "white"
  ax.bar(
    layout.left, prob - baseline, layout.width, bottom=baseline, align="edge", color=_TRAIN_COLOR,
    edgecolor=edge, linewidth=0.6, label="calibration bins: predicted P(correct)",
  )  # fmt: skip
  # Narrower test bars in front: the height gap to the bar behind is the bin's calibration error.
  seen = test_counts > 0
  test_acc = test_hits[seen] / test_counts[seen]
  ax.bar(
    layout.left[seen] + 0.2 * layout.width[seen], test_acc - baseline, 0.6 * layout.width[seen],
    bottom=baseline, align="edge", color=_TEST_COLOR, alpha=0.85, linewidth=0,
    label=f"test bins: accuracy; {ece_name} = {ece:.2%}",
  )  # fmt: skip
  lower = upper = None
  if bounds is not None:
    lower, upper = _draw_intervals(ax, train_bins, layout, delta, bounds)
  label = f"{event} {'test ' if accuracy is None else ''}accuracy {baseline:.1%}"
  ax.axhline(baseline, color="0.15", linestyle="--", linewidth=1.0, label=label)
  if annotate:
    _annotate_ends(ax, prob, lower, upper, delta)

  heights = [prob, test_acc, [baseline]] + ([lower] if lower is not None else [])
  low = float(np.min(np.concatenate([np.ravel(h) for h in heights])))
  ax.set_ylim(max(0.0, low - 0.05), 1.02)
  ax.set_xlim(0.0, 1.0)
  ax.xaxis.set_major_formatter(ticker.PercentFormatter(1.0, decimals=0))
  ordered_by = "predicted probability" if order == "prob" else "score bin"
  ax.set_xlabel(f"calibration examples, by {ordered_by} (bar width = bin weight)")
  ax.set_ylabel(f"P({event} prediction correct)")
  ax.grid(axis="y", alpha=0.3)
  ax.set_axisbelow(True)
  _legend_below(ax)
  title = "Calibrated {event} bins ({bins})" if title is None else title
  bins = metrics_lib.bins_phrase(train_bins.n_bins, layout.index.size, "equal-mass")
  ax.set_title(title.replace("{event}", event).replace("{bins}", bins))


def _legend_below(ax: Axes, columns: int = 2) -> None:
  # Below the axes: bars can reach any height at any x, so inside it would cover some.
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=columns, fontsize="small")


def _annotate_ends(ax: Axes, prob, lower, upper, delta: float) -> None:
  """Boxes the first and last bins' predictions (and intervals) in an empty corner."""
  lines = []
  for which, i in (("first", 0), ("last", -1)):
    text = f"{which} bin: p = {prob[i]:.3f}"
    if lower is not None:
      text += f", {_confidence(delta)} interval [{lower[i]:.3f}, {upper[i]:.3f}]"
    lines.append(text)
  # Ordered by probability, bars fall from left to right: the lower left is empty (else upper).
  loc = "lower left" if prob[0] >= prob[-1] else "upper left"
  box = offsetbox.AnchoredText(
    "\n".join(lines), loc=loc, prop={"size": "small", "color": _INTERVAL_COLOR}, frameon=True
  )
  box.patch.set(alpha=0.9, edgecolor="0.8")
  ax.add_artist(box)


def bin_figure(
  train_bins: binning.Bins,
  test_bins: binning.Bins,
  *,
  accuracy: float | None = None,
  delta: float = 0.05,
  bounds: str | None = "clopper_pearson",
  order: str = "prob",
  annotate: bool = True,
  event: str = "Top-1",
  title: str | None = None,
  ax: Axes | None = None,
) -> Figure:
  """Calibrated Top-1 bins of one score, calibration and test superimposed (paper Fig. 1).

  Each bin is a bar from the baseline accuracy to its predicted probability, as wide as its
  calibration weight; the test accuracy in the same bin (``test_bins``: ``binning.refit``) is
  a narrower bar in front, so the height gap is that bin's calibration error. Error bars are
  ``1 - delta`` intervals (``bounds``: one of ``BOUNDS``, or None) on the calibration counts.

  Args:
    accuracy: the baseline; default the test accuracy (the paper's choice).
    order: "prob": by predicted probability, highest first; "bins": ascending score.
    event: the predicted event, for labels ("Top-1", "Top-5").
    title: "{bins}" becomes the requested and effective bin counts, "{event}" the event.
    ax: draw into these axes instead of a new figure.

  Raises:
    ValueError: bins that are not a matching pair, or an option out of range.
  """
  _check_pair(train_bins, test_bins)
  accuracy, delta = _check_options(accuracy, delta, bounds, order)
  ax = figures.new_figure((9.0, 5.0)).add_subplot() if ax is None else ax
  _draw_bins(ax, train_bins, test_bins, accuracy, delta, bounds, order, annotate, event, title)
  return ax.get_figure(root=True)


def refinement_figure(
  coarse: tuple[binning.Bins, binning.Bins],
  fine: tuple[binning.Bins, binning.Bins],
  *,
  accuracy: float | None = None,
  delta: float = 0.05,
  bounds: str | None = "clopper_pearson",
  overlay: bool = True,
  event: str = "Top-1",
  title: str | None = None,
) -> Figure:
  """The same score with few and with many bins, side by side (paper Fig. 2).

  Each panel is a ``bin_figure``; with ``overlay`` the fine panel also traces the coarse
  predictions as a step line. ``coarse`` and ``fine`` are (train_bins, test_bins) pairs of
  the same score and splits; the other options are ``bin_figure``'s. ``title``: None names
  the bin counts and both test ECEs; "" for none.

  Raises:
    ValueError: not a matching (train, test) pair of bins, or an option out of range.
  """
  pairs = {"coarse": coarse, "fine": fine}
  for name, pair in pairs.items():
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise ValueError(
        f"{name}: expected a (train_bins, test_bins) pair, got {type(pair).__name__}"
      )
    _check_pair(*pair, name=name)
  accuracy, delta = _check_options(accuracy, delta, bounds)
  fig = figures.new_figure((figures.PAGE_WIDTH, 5.2))
  axes = fig.subplots(1, 2, sharey=True)
  for ax, (train, test) in zip(axes, pairs.values(), strict=True):
    _draw_bins(ax, train, test, accuracy, delta, bounds, "prob", True, event, "{bins}")
  if overlay:
    layout = _layout(coarse[0], "prob")
    # No baseline: stairs would otherwise close the outline with stray vertical lines to 0.
    axes[1].stairs(
      layout.prob, np.append(layout.left, 1.0), baseline=None, color="0.1", linewidth=1.4,
      label=f"{layout.index.size}-bin predictions",
    )  # fmt: skip
  for ax in axes:  # one column: two columns of these labels are wider than a panel
    _legend_below(ax, columns=1)
  # Shared y: the limits of the panel drawn last would cut the other one.
  axes[0].set_ylim(min(ax.get_ylim()[0] for ax in axes), max(ax.get_ylim()[1] for ax in axes))
  axes[1].set_ylabel("")
  if title is None:
    (few, few_test), (many, many_test) = coarse, fine
    ece = metrics_lib.ece_name("each panel's", "equal-mass", calibration=True)
    title = (
      f"{few.n_bins} vs {many.n_bins} bins of one score: more bins resolve P(correct) more "
      f"finely, each from fewer examples\n{ece}: {metrics_lib.binned_ece(few, few_test):.2%} "
      f"with {few.n_bins}, {metrics_lib.binned_ece(many, many_test):.2%} with {many.n_bins}"
    )
  if title:
    fig.suptitle(title)
  return fig
