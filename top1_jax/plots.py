"""Figures: calibrated Top-1 bins, bin refinement, bin-count ablations, image grids.

* ``bin_figure``: the paper's Figure 1. Calibration and test bins of one score,
  ordered from most to least confident, drawn as bars up or down from the
  model's accuracy, with per-bin confidence intervals and the ECE.
* ``refinement_figure``: the paper's Figure 2. The same score with a coarse and a
  fine binning side by side; the fine panel also traces the coarse predictions.
* ``ablation_figure``: Brier, ECE and EOR (mean ± std over splits) against the
  number of bins, one line per score, from ``evaluate.cross_validate``.
* ``image_grid``: tiles of images with their given label, predicted label and a
  probability (the supplementary's mislabelled-image finder).
* ``save_figure``: atomic write (temp file in the target directory, then rename).

Figures are ``matplotlib.figure.Figure`` objects with an Agg canvas, made without
pyplot: importing this module never switches the user's backend or opens a
window, and figures are not kept alive by pyplot's registry.
"""

import math
import os
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from matplotlib import offsetbox, ticker
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from top1_jax import binning, data, evaluate
from top1_jax import metrics as metrics_lib

BOUNDS = ("clopper_pearson", "hoeffding")
ORDERS = ("prob", "bins")

_BOUND_NAMES = {"clopper_pearson": "Clopper–Pearson", "hoeffding": "Hoeffding"}
_TRAIN_COLOR = "#9ecae1"  # light blue: calibration (train) bins
_TEST_COLOR = "#e6550d"  # orange: test bins
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


# --------------------------------------------------------------------------- checks


def _check_bins(name: str, bins) -> None:
  if not isinstance(bins, binning.Bins):
    raise ValueError(f"{name}: expected binning.Bins, got {type(bins).__name__}")
  counts = np.shape(bins.counts)
  if len(counts) != 1 or np.shape(bins.hits) != counts or np.shape(bins.prob) != counts:
    raise ValueError(
      f"{name}: expected 1-D counts, hits and prob of one shape (one binning, not a batch),"
      f" got {counts}, {np.shape(bins.hits)}, {np.shape(bins.prob)}"
    )
  if int(np.sum(bins.counts)) <= 0:
    raise ValueError(f"{name}: no examples were counted in any bin")


def _check_pair(train_bins, test_bins, name: str = "") -> None:
  """Checks a (calibration, test) pair; ``name`` prefixes messages for tuple arguments."""
  train_name = f"{name}[0]" if name else "train_bins"
  test_name = f"{name}[1]" if name else "test_bins"
  _check_bins(train_name, train_bins)
  _check_bins(test_name, test_bins)
  if train_bins.n_bins != test_bins.n_bins:
    raise ValueError(
      f"{test_name}: expected {train_bins.n_bins} bins like {train_name}, got"
      f" {test_bins.n_bins} (count the test split with binning.refit(train_bins, ...))"
    )
  if not np.array_equal(np.asarray(train_bins.edges), np.asarray(test_bins.edges)):
    raise ValueError(
      f"{test_name}: bin edges differ from {train_name}'s"
      " (count the test split with binning.refit(train_bins, ...))"
    )


def _check_probability(name: str, value, *, open_interval: bool = False) -> float:
  try:
    value = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name}: expected a number, got {value!r}") from None
  inside = 0.0 < value < 1.0 if open_interval else 0.0 <= value <= 1.0
  if not inside:
    interval = "(0, 1)" if open_interval else "[0, 1]"
    raise ValueError(f"{name}: expected a value in {interval}, got {value}")
  return value


def _check_choice(name: str, value, choices: Sequence) -> None:
  if value not in choices:
    raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")


def _check_text(name: str, value) -> None:
  if not isinstance(value, str) or not value:
    raise ValueError(f"{name}: expected a non-empty string, got {value!r}")


# --------------------------------------------------------------------------- layout


class _Layout(NamedTuple):
  """Where each drawn bin goes: the bins in plotting order, their x span."""

  index: np.ndarray  # [B] bin indices with calibration examples, in plotting order
  left: np.ndarray  # [B] left edge on the [0, 1] axis
  width: np.ndarray  # [B] calibration weight of the bin


def _layout(train_bins: binning.Bins, order: str) -> _Layout:
  counts = np.asarray(train_bins.counts, np.float64)
  index = np.flatnonzero(counts > 0)  # padding slots and merged tie groups hold no data
  if order == "prob":
    prob = np.asarray(train_bins.prob, np.float64)[index]
    index = index[np.argsort(-prob, kind="stable")]
  width = counts[index] / counts.sum()
  left = np.concatenate([[0.0], np.cumsum(width)[:-1]])
  return _Layout(index, left, width)


def _test_accuracy(test_bins: binning.Bins) -> float:
  return float(np.sum(test_bins.hits)) / float(np.sum(test_bins.counts))


def _confidence(delta: float) -> str:
  """1 - delta as a percentage with the digits it needs: 95%, 99.5%."""
  for digits in range(4):
    text = f"{100 * (1 - delta):.{digits}f}"
    if abs(float(text) - 100 * (1 - delta)) < 1e-9:
      break
  return f"{text}%"


def _new_figure(figsize: tuple[float, float]) -> Figure:
  fig = Figure(figsize=figsize, layout="constrained")
  FigureCanvasAgg(fig)
  return fig


# --------------------------------------------------------------------------- bins


def _draw_bins(
  ax: Axes,
  train_bins: binning.Bins,
  test_bins: binning.Bins,
  *,
  accuracy: float | None,
  delta: float,
  bounds: str | None,
  order: str,
  annotate: bool,
  event: str,
) -> _Layout:
  """Draws one calibration/test bin pair on ``ax``; returns the layout used."""
  layout = _layout(train_bins, order)
  baseline = _test_accuracy(test_bins) if accuracy is None else accuracy
  ece = float(metrics_lib.ece(train_bins, test_bins))
  prob = np.asarray(train_bins.prob, np.float64)[layout.index]
  test_counts = np.asarray(test_bins.counts)[layout.index]
  test_hits = np.asarray(test_bins.hits, np.float64)[layout.index]
  centre = layout.left + layout.width / 2
  many = layout.index.size > 30

  ax.bar(
    layout.left,
    prob - baseline,
    layout.width,
    bottom=baseline,
    align="edge",
    color=_TRAIN_COLOR,
    edgecolor="white" if not many else _TRAIN_COLOR,
    linewidth=0.6,
    label="calibration bins: predicted P(correct)",
  )
  # Test bins are narrower and drawn in front, so the height gap to the calibration
  # bar behind is the per-bin calibration error. Empty test bins have no accuracy.
  seen = test_counts > 0
  test_acc = test_hits[seen] / test_counts[seen]
  ax.bar(
    layout.left[seen] + 0.2 * layout.width[seen],
    test_acc - baseline,
    0.6 * layout.width[seen],
    bottom=baseline,
    align="edge",
    color=_TEST_COLOR,
    alpha=0.85,
    linewidth=0,
    label=f"test bins: accuracy, ECE = {ece:.2%}",
  )
  lower = upper = None
  if bounds is not None:
    lower, upper = (
      np.asarray(b, np.float64)[layout.index]
      for b in binning.confidence_bounds(train_bins, delta, bounds)
    )
    # The interval is around hits / counts; the prediction carries the prior, so
    # clip in case it sits a hair outside.
    yerr = np.stack([np.maximum(prob - lower, 0.0), np.maximum(upper - prob, 0.0)])
    ax.errorbar(
      centre,
      prob,
      yerr=yerr,
      fmt="none",
      ecolor="#08306b",
      alpha=0.55 if many else 1.0,
      elinewidth=0.6 if many else 1.0,
      capsize=0 if many else 3,
      label=f"{_confidence(delta)} {_BOUND_NAMES[bounds]} interval",
    )
  ax.axhline(
    baseline,
    color="0.15",
    linestyle="--",
    linewidth=1.0,
    label=f"{event} {'test ' if accuracy is None else ''}accuracy {baseline:.1%}",
  )
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
  return layout


def _legend_below(ax: Axes) -> None:
  # Below the axes: bars can reach any height at any x, so inside it would cover some.
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=2, fontsize="small")


def _annotate_ends(ax: Axes, prob, lower, upper, delta: float) -> None:
  """Boxes the first and last bins' predictions (and intervals) in an empty corner."""
  lines = []
  for which, i in (("first", 0), ("last", -1)):
    text = f"{which} bin: p = {prob[i]:.3f}"
    if lower is not None:
      text += f", {_confidence(delta)} interval [{lower[i]:.3f}, {upper[i]:.3f}]"
    lines.append(text)
  # Bars run from high on the left to low on the right when ordered by probability,
  # so the region under the baseline on the left is empty (above it, if reversed).
  loc = "lower left" if prob[0] >= prob[-1] else "upper left"
  box = offsetbox.AnchoredText(
    "\n".join(lines), loc=loc, prop={"size": "small", "color": "#08306b"}, frameon=True
  )
  box.patch.set_alpha(0.9)
  box.patch.set_edgecolor("0.8")
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

  Each bin with calibration examples is a bar from the baseline accuracy up (or
  down) to its predicted probability ``train_bins.prob``; the test split's
  observed accuracy in the same bin is a narrower bar in front, so the height gap
  is that bin's calibration error. Bar widths are the bins' calibration weights
  (equal-count bins have equal widths) and the x axis is the fraction of
  calibration examples, most confident first. Error bars are the per-bin
  ``1 - delta`` intervals of ``binning.confidence_bounds`` on the calibration
  counts; the legend gives ``metrics.ece(train_bins, test_bins)``.

  Args:
    train_bins: bins fitted on the calibration split (``binning.fit``).
    test_bins: the test split counted in the same bins (``binning.refit``).
    accuracy: the baseline; default the test accuracy (the paper's choice).
    delta: failure probability of the intervals, in (0, 1).
    bounds: "clopper_pearson", "hoeffding", or None for no error bars.
    order: "prob": by predicted probability, highest first; "bins": in bin order
      (ascending score, i.e. most confident first for an uncertainty such as
      -log pmax, least confident first for a confidence such as pmax).
    annotate: write the first and last bins' predictions on the plot.
    event: the predicted event, for labels ("Top-1", "Top-5").
    title: axes title; default names the event and the number of bins.
    ax: draw into these axes instead of a new figure.

  Returns:
    The ``Figure`` (the one holding ``ax`` when given).

  Raises:
    ValueError: bins that are not a matching pair, or a bad option.
  """
  _check_pair(train_bins, test_bins)
  if accuracy is not None:
    accuracy = _check_probability("accuracy", accuracy)
  delta = _check_probability("delta", delta, open_interval=True)
  _check_choice("bounds", bounds, (*BOUNDS, None))
  _check_choice("order", order, ORDERS)
  _check_text("event", event)
  if ax is None:
    fig = _new_figure((9.0, 5.0))
    ax = fig.add_subplot()
  else:
    fig = ax.get_figure(root=True)
  layout = _draw_bins(
    ax,
    train_bins,
    test_bins,
    accuracy=accuracy,
    delta=delta,
    bounds=bounds,
    order=order,
    annotate=annotate,
    event=event,
  )
  if title is None:
    used = layout.index.size
    merged = "" if used == train_bins.n_bins else f" of {train_bins.n_bins}, tied scores merged"
    title = f"Calibrated {event} bins ({used} bins{merged})"
  ax.set_title(title)
  return fig


def refinement_figure(
  coarse: tuple[binning.Bins, binning.Bins],
  fine: tuple[binning.Bins, binning.Bins],
  *,
  accuracy: float | None = None,
  delta: float = 0.05,
  bounds: str | None = "clopper_pearson",
  overlay: bool = True,
  event: str = "Top-1",
  title: str | None = "More bins approximate the conditional probability better",
) -> Figure:
  """The same score with few and with many bins, side by side (paper Fig. 2).

  Each panel is a ``bin_figure`` (bins ordered by predicted probability). With
  ``overlay`` the fine panel also traces the coarse predictions as a step line,
  so one sees the fine bins resolve the probability within each coarse bin.

  Args:
    coarse: (train_bins, test_bins) with few bins, e.g. 10.
    fine: (train_bins, test_bins) of the same score and splits with more bins, e.g. 100.
    accuracy: the baseline of both panels; default each panel's test accuracy.
    delta: failure probability of the intervals, in (0, 1).
    bounds: "clopper_pearson", "hoeffding", or None for no error bars.
    overlay: trace the coarse predictions on the fine panel.
    event: the predicted event, for labels ("Top-1", "Top-5").
    title: figure title (None for none).

  Returns:
    A ``Figure`` with two axes sharing the y axis.

  Raises:
    ValueError: an argument that is not a matching (train, test) pair of bins.
  """
  pairs = {"coarse": coarse, "fine": fine}
  for name, pair in pairs.items():
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise ValueError(
        f"{name}: expected a (train_bins, test_bins) pair, got {type(pair).__name__}"
      )
    _check_pair(*pair, name=name)
  if accuracy is not None:
    accuracy = _check_probability("accuracy", accuracy)
  delta = _check_probability("delta", delta, open_interval=True)
  _check_choice("bounds", bounds, (*BOUNDS, None))
  _check_text("event", event)

  fig = _new_figure((14.0, 5.2))
  axes = fig.subplots(1, 2, sharey=True)
  layouts = {}
  for ax, (name, (train_bins, test_bins)) in zip(axes, pairs.items(), strict=True):
    layouts[name] = _draw_bins(
      ax,
      train_bins,
      test_bins,
      accuracy=accuracy,
      delta=delta,
      bounds=bounds,
      order="prob",
      annotate=True,
      event=event,
    )
    ax.set_title(f"{layouts[name].index.size} bins")
  if overlay:
    coarse_layout = layouts["coarse"]
    edges = np.append(coarse_layout.left, 1.0)
    coarse_prob = np.asarray(coarse[0].prob, np.float64)[coarse_layout.index]
    axes[1].stairs(
      coarse_prob,
      edges,
      color="0.1",
      linewidth=1.4,
      label=f"{coarse_layout.index.size}-bin predictions",
    )
    _legend_below(axes[1])
  # Shared y: the limits of the panel drawn last would cut the other one.
  low = min(ax.get_ylim()[0] for ax in axes)
  high = max(ax.get_ylim()[1] for ax in axes)
  axes[0].set_ylim(low, high)
  axes[1].set_ylabel("")
  if title:
    fig.suptitle(title)
  return fig


# --------------------------------------------------------------------------- ablation


def ablation_figure(
  results: Mapping[str, evaluate.CrossValidation],
  *,
  metrics: Sequence[str] = ("brier", "ece", "eor"),
  title: str | None = "Scores against the number of bins (mean ± std over splits)",
) -> Figure:
  """Cross-validated metrics against the number of bins, one line per score.

  One panel per metric, log x axis at the bin counts; each score is a line
  through the means with a band of ± one standard deviation over the splits.

  Args:
    results: score name -> ``evaluate.cross_validate`` result.
    metrics: names from ``evaluate.METRICS``, one panel each.
    title: figure title (None for none).

  Returns:
    A ``Figure`` with one axes per metric and one line per score on each.

  Raises:
    ValueError: empty ``results``, a value that is not a ``CrossValidation``, or
      an unknown metric.
  """
  if not isinstance(results, Mapping) or not results:
    raise ValueError("results: expected a non-empty dict of score name -> CrossValidation")
  for name, result in results.items():
    if not isinstance(result, evaluate.CrossValidation):
      raise ValueError(
        f"results[{name!r}]: expected evaluate.CrossValidation, got {type(result).__name__}"
      )
  if isinstance(metrics, str) or not metrics:
    raise ValueError(f"metrics: expected a non-empty list of names, got {metrics!r}")
  for metric in metrics:
    _check_choice("metrics", metric, evaluate.METRICS)

  fig = _new_figure((4.6 * len(metrics), 4.2))
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
    ax.set_xlabel("number of bins")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.FixedLocator(all_bins))
    ax.xaxis.set_major_formatter(ticker.FixedFormatter([str(n) for n in all_bins]))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    if len(all_bins) == 1:
      ax.set_xlim(all_bins[0] / 1.5, all_bins[0] * 1.5)
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


# --------------------------------------------------------------------------- images


def _shorten(name: str, max_chars: int) -> str:
  return name if len(name) <= max_chars else name[: max_chars - 1].rstrip() + "…"


def _format_prob(p: float) -> str:
  """Three decimals, more when needed so that p < 1 never prints as 1.000."""
  for digits in range(3, 7):
    text = f"{p:.{digits}f}"
    if (float(text) not in (0.0, 1.0)) or p in (0.0, 1.0):
      return text
  return text


def _label_array(name: str, labels, num: int, num_classes: int) -> np.ndarray:
  arr = np.asarray(labels)
  if arr.ndim != 1:
    raise ValueError(f"{name}: expected a 1-D array, got shape {arr.shape}")
  if arr.shape[0] != num:
    raise ValueError(f"{name}: expected {num} entries like images, got {arr.shape[0]}")
  if arr.dtype.kind not in "iu":
    raise ValueError(f"{name}: expected integer class indices, got dtype {arr.dtype}")
  if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
    raise ValueError(
      f"{name}: labels out of range [0, {num_classes}): min {arr.min()}, max {arr.max()}"
    )
  return arr


def image_grid(
  images,
  given_labels,
  predicted_labels,
  probs,
  class_names: Sequence[str],
  *,
  columns: int = 8,
  title: str | None = None,
  max_name_chars: int = 18,
) -> Figure:
  """Images titled with their given label, predicted label and a probability.

  Made for the mislabelled-image finder (paper supplement): pass the most
  confident wrong predictions, e.g. the incorrect examples of the most confident
  bins, with ``probs`` their calibrated P(correct) (``binning.predict``) or pmax.

  Args:
    images: [N, H, W, C] float in [0, 1], C = 1 (shown in grayscale), 3 or 4.
    given_labels: [N] int, the dataset's labels.
    predicted_labels: [N] int, the model's Top-1 classes.
    probs: [N] float in [0, 1], shown as "p=...".
    class_names: one name per class; long names are shortened.
    columns: tiles per row (fewer when N is smaller).
    title: figure title (None for none).
    max_name_chars: class names longer than this are cut with an ellipsis.

  Returns:
    A ``Figure`` with exactly N axes, one image each.

  Raises:
    ValueError: a shape, length, range or type that does not fit.
  """
  images = np.asarray(images)
  if images.ndim != 4:
    raise ValueError(f"images: expected [N, H, W, C], got shape {images.shape}")
  num, height, width, channels = images.shape
  if num == 0:
    raise ValueError(f"images: expected at least one image, got shape {images.shape}")
  if channels not in (1, 3, 4):
    raise ValueError(f"images: expected 1, 3 or 4 channels, got shape {images.shape}")
  if images.dtype.kind != "f":
    raise ValueError(f"images: expected floats in [0, 1], got dtype {images.dtype}")
  if not np.all(np.isfinite(images)) or images.min() < 0.0 or images.max() > 1.0:
    raise ValueError(
      f"images: expected finite values in [0, 1], got min {np.nanmin(images):g},"
      f" max {np.nanmax(images):g}"
    )
  if isinstance(class_names, str) or not all(isinstance(c, str) for c in class_names):
    raise ValueError("class_names: expected a sequence of strings, one per class")
  if not class_names:
    raise ValueError("class_names: expected at least one class name")
  given_labels = _label_array("given_labels", given_labels, num, len(class_names))
  predicted_labels = _label_array("predicted_labels", predicted_labels, num, len(class_names))
  probs = np.asarray(probs)
  if probs.shape != (num,):
    raise ValueError(f"probs: expected shape ({num},) like images, got {probs.shape}")
  if probs.dtype.kind not in "fiu" or not np.all((probs >= 0) & (probs <= 1)):
    raise ValueError("probs: expected probabilities in [0, 1]")
  if isinstance(columns, bool) or not isinstance(columns, (int, np.integer)) or columns < 1:
    raise ValueError(f"columns: expected a positive integer, got {columns!r}")
  if isinstance(max_name_chars, bool) or not isinstance(max_name_chars, int) or max_name_chars < 4:
    raise ValueError(f"max_name_chars: expected an integer >= 4, got {max_name_chars!r}")

  columns = min(int(columns), num)
  rows = math.ceil(num / columns)
  tile = 1.75  # inches per image: the three title lines stay legible at 8 pt
  tile_height = tile * height / width
  fig = _new_figure((columns * tile, rows * (tile_height + 0.62) + (0.45 if title else 0.0)))
  for i in range(num):
    ax = fig.add_subplot(rows, columns, i + 1)
    image = images[i, ..., 0] if channels == 1 else images[i]
    ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    given = _shorten(class_names[given_labels[i]], max_name_chars)
    predicted = _shorten(class_names[predicted_labels[i]], max_name_chars)
    ax.set_title(
      f"given: {given}\npred: {predicted}\np={_format_prob(float(probs[i]))}",
      fontsize=8,
      linespacing=1.15,
      color="#a50f15" if given_labels[i] != predicted_labels[i] else "black",
    )
  if title:
    fig.suptitle(title)
  return fig


# --------------------------------------------------------------------------- files


def save_figure(fig: Figure, path: str | os.PathLike, *, dpi: int = 150) -> pathlib.Path:
  """Writes ``fig`` atomically and closes it.

  The bounding box is tight (legends placed outside axes are kept, also in figures
  made elsewhere). The image goes to a temporary file in the target directory, is
  flushed to disk, then renamed over ``path``: a reader never sees a partial file,
  and a failure leaves any existing file untouched. Parent directories are created.

  Args:
    fig: the figure.
    path: destination; the suffix picks the format (.png, .pdf, .svg, ...).
    dpi: resolution of raster formats.

  Returns:
    ``path`` as a ``pathlib.Path``. A figure made through pyplot is closed
    (removed from pyplot's registry); the object itself stays usable.

  Raises:
    ValueError: not a Figure, or a suffix matplotlib cannot write.
  """
  if not isinstance(fig, Figure):
    raise ValueError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
  path = pathlib.Path(path)
  fmt = path.suffix[1:].lower()
  supported = FigureCanvasAgg.get_supported_filetypes()
  if fmt not in supported:
    raise ValueError(
      f"path: expected a suffix among {sorted('.' + s for s in supported)}, got {path.name!r}"
    )
  try:
    options = {"format": fmt, "dpi": dpi, "bbox_inches": "tight", "pad_inches": 0.08}
    data.atomic_write(path, lambda file: fig.savefig(file, **options))
  finally:
    # Only figures made through pyplot are registered there; ours are not.
    if "matplotlib.pyplot" in sys.modules:
      sys.modules["matplotlib.pyplot"].close(fig)
  return path
