"""Calibration under dataset shift (Ovadia et al. 2019): metrics against a shift's intensity,
boxes over corruptions, histograms out of distribution, recalibration, accuracy estimates.

A variant is a display label with a column filter selecting one tidy row per (shift, severity);
one whose rows need the labels (the oracle) is a grey reference that never sets axis limits."""

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from top1_jax.core import metrics as metrics_lib
from top1_jax.core import scores
from top1_jax.evaluation import accuracy_estimates, crossval
from top1_jax.io import results
from top1_jax.plots import figures
from top1_jax.plots.sweeps import REFERENCE_COLOR, check_metrics, format_panel

CLEAN = results.CLEAN  # the unshifted test rows (severity 0): the first point of every shift
AXIS_LABELS = results.GEOMETRIC_SHIFTS  # x labels; any other shift is a corruption
CORRUPTIONS = "corruptions"  # a recalibration panel's shift: the mean over every corruption

_METRIC_COLUMNS = set(results.METRIC_COLUMNS) | {f"{m}_num_runs" for m in crossval.METRICS}
_MARKERS = ("o", "s", "^", "D", "v", "P")


def _check_rows(rows) -> list[Mapping[str, Any]]:
  if isinstance(rows, (str, Mapping)) or not isinstance(rows, Sequence) or not rows:
    raise ValueError(f"rows: expected a non-empty list of tidy results rows, got {rows!r:.60}")
  for index, row in enumerate(rows):
    named = isinstance(row, Mapping) and isinstance(row.get("shift"), str)
    severity = row.get("severity") if named else None
    if isinstance(severity, bool) or not isinstance(severity, (int, float, np.number)):
      raise ValueError(
        f"rows: expected dicts with a 'shift' and a numeric 'severity', row {index} is {row!r:.80}"
      )
  return list(rows)


def _check_metrics(metrics, rows) -> tuple[str, ...]:
  check_metrics(metrics)
  for metric in metrics:
    if not any(metric in row for row in rows):
      raise ValueError(f"metrics: expected a column the rows hold, got {metric!r}")
  return tuple(metrics)


def _check_variants(variants, rows) -> dict[str, dict[str, Any]]:
  if not isinstance(variants, Mapping) or not variants:
    raise ValueError(f"variants: expected a non-empty dict of label -> filter, got {variants!r}")
  columns = {column for row in rows for column in row}
  for label, conditions in variants.items():
    if not isinstance(label, str) or not isinstance(conditions, Mapping):
      raise ValueError(f"variants: expected str -> dict of column values, got {label!r}")
    if unknown := sorted(set(conditions) - columns):
      raise ValueError(f"variants[{label!r}]: expected columns of the rows, got {unknown}")
    if not any(_matches(row, conditions) for row in rows):
      raise ValueError(f"variants[{label!r}]: {dict(conditions)} matches no row")
  return {label: dict(conditions) for label, conditions in variants.items()}


def _matches(row: Mapping[str, Any], conditions: Mapping[str, Any]) -> bool:
  return all(row.get(column) == value for column, value in conditions.items())


def _pick(rows, label: str, conditions, shifts) -> dict[tuple, Mapping[str, Any]]:
  """(shift, severity) -> the variant's one row there, over the given shifts."""
  found: dict[tuple, list] = {}
  for row in rows:
    if row["shift"] in shifts and _matches(row, conditions):
      found.setdefault((row["shift"], row["severity"]), []).append(row)
  for (shift, severity), matched in found.items():
    if len(matched) > 1:
      # The settings (not metrics) that differ between the rows, results.csv's first.
      columns = dict.fromkeys([*results.COLUMNS, *(c for r in matched for c in r)])
      settings = [c for c in columns if c not in _METRIC_COLUMNS]
      differ = [c for c in settings if len({repr(r.get(c)) for r in matched}) > 1]
      raise ValueError(
        f"variants[{label!r}]: expected one row per (shift, severity), got {len(matched)} at "
        f"shift {shift!r} severity {severity} (they differ in {differ[:4]}: add one to the filter)"
      )
  return {key: matched[0] for key, matched in found.items()}


def _prepare(rows, variants, metrics, shifts: set, what: str, ece_binning: str):
  """(metrics, label -> picked rows, compared labels, reference labels, styles, the ECE's
  label) of checked ``rows``."""
  metrics = _check_metrics(metrics, rows)
  picked = {}
  for label, conditions in _check_variants(variants, rows).items():
    picked[label] = _pick(rows, label, conditions, shifts | {CLEAN})
    if not any(name != CLEAN for name, _ in picked[label]):
      raise ValueError(f"variants[{label!r}]: {conditions} matches no row of {what}")
  references = [
    k for k, p in picked.items() if any(scores.needs_labels(r.get("score")) for r in p.values())
  ]
  compared = [label for label in picked if label not in references]
  ece = _ece_label([row for label in compared for row in picked[label].values()], ece_binning)
  return metrics, picked, compared, references, _styles(compared), ece


def _styles(labels: Sequence[str]) -> dict[str, dict]:
  """Colour, dash pattern and marker of each variant, the same in every panel."""
  colors = mpl.rcParams["axes.prop_cycle"].by_key().get("color") or ["C0"]
  return {
    label: {
      "color": colors[i % len(colors)],
      "linestyle": "-" if i < len(colors) else "--",
      "marker": _MARKERS[i % len(_MARKERS)],
    }
    for i, label in enumerate(labels)
  }


def _ece_label(rows: Sequence[Mapping[str, Any]], ece_binning: str) -> str:
  """The ECE's y label, naming the rows' bins: requested, and the fewest after ties ("each
  variant's" when the rows ask for different counts)."""
  requested = {r.get("n_bins") for r in rows} - {None}
  n_bins = requested.pop() if len(requested) == 1 else "each variant's"
  effective = [r["num_effective_bins"] for r in rows if r.get("num_effective_bins") is not None]
  # The protocol's equal-mass bins are quantiles of the score on the clean calibration part.
  calibration = ece_binning == "equal-mass"
  return metrics_lib.ece_name(
    n_bins, ece_binning, min(effective, default=None), calibration=calibration, percent=True
  )


def _value(row: Mapping[str, Any], column: str) -> float:
  value = row.get(column)
  return np.nan if value is None else float(value)


@contextlib.contextmanager
def _kept_limits(ax) -> Iterator[None]:
  """Within it, drawing (the references) does not move limits the compared rows set."""
  compared = bool(ax.lines or ax.collections or ax.patches)  # else references set the limits
  limits = ax.get_ylim()
  yield
  if compared:
    ax.set_ylim(limits)


def _note_off_scale(ax, values: Mapping[str, Mapping], names: Mapping) -> None:
  """Says below the panel where a reference (label -> x -> values) lies off the drawn range."""
  low, high = ax.get_ylim()
  notes = []
  for label, by_x in values.items():
    for side, off in (("below", lambda v: np.any(v < low)), ("above", lambda v: np.any(v > high))):
      at = [names[x] for x in names if x in by_x and off(np.asarray(by_x[x]))]
      span = at[0] if len(at) == 1 else f"{len(at)} points in {at[0]}–{at[-1]}" if at else ""
      notes += [f"{label}: off scale {side} at {span}"] if at else []
  if notes:
    _note_below(ax, "; ".join(notes))


def _note_below(ax, text: str) -> None:
  """A small note under the panel's x label, where it covers no data."""
  ax.annotate(
    text, xy=(0, 0), xycoords="axes fraction", xytext=(0, -36), textcoords="offset points",
    va="top", ha="left", fontsize="x-small", color="0.3", annotation_clip=False,
  )  # fmt: skip


def _legend(fig: Figure, labels: Sequence[str], styles: dict, references: Sequence[str], kind):
  grey = {"color": REFERENCE_COLOR, "linestyle": "--", "marker": None}
  handles = [kind(styles[label]) for label in labels] + [kind(grey)] * len(references)
  names = list(labels) + [f"{name} (needs labels)" for name in references]
  figures.legend_below(fig, handles, names)


def _points(picked, shift: str) -> dict:
  """Severity -> a variant's row along ``shift``, its clean row at 0 unless the shift has one."""
  points = {severity: row for (name, severity), row in picked.items() if name == shift}
  clean = [row for (name, _), row in picked.items() if name == CLEAN]
  if clean and 0 not in points:
    points[0] = clean[0]
  return points


def _curve(picked, shift: str, metric: str):
  """(severities, mean, std) of one variant along ``shift``."""
  x = sorted(points := _points(picked, shift))
  mean = np.asarray([_value(points[s], metric) for s in x])
  std = np.asarray([_value(points[s], f"{metric}_std") for s in x])
  return np.asarray(x, np.float64), mean, np.nan_to_num(std)


def _draw_reference_curves(ax, picked: Mapping[str, Mapping], shift: str, metric: str) -> None:
  curves = {label: _curve(rows, shift, metric)[:2] for label, rows in picked.items()}
  with _kept_limits(ax):
    for x, mean in curves.values():
      ax.plot(x, mean, color=REFERENCE_COLOR, linestyle="--", linewidth=1.0)
  by_severity = {label: dict(zip(x, mean, strict=True)) for label, (x, mean) in curves.items()}
  names = {x: f"{x:g}" for x in sorted({x for points in by_severity.values() for x in points})}
  _note_off_scale(ax, by_severity, names)


def shift_curves(
  rows: Sequence[Mapping[str, Any]],
  variants: Mapping[str, Mapping[str, Any]],
  shift: str,
  metrics: Sequence[str] = ("accuracy", "brier", "ece"),
  *,
  ece_binning: str = "equal-mass",
  title: str | None = "Under shift '{shift}' (0 = clean test set): mean ± std",
) -> Figure:
  """Metrics against one shift's intensity, a line per variant (Ovadia et al., Figs. 1-2).

  One panel per metric; x is ``severity`` (degrees for ``rotate``, pixels for ``translate``,
  1-5 for a corruption), the ``"clean"`` row at 0 unless the shift has its own. Each line
  has a band of ± ``<metric>_std``; a missing value is a gap.

  Args:
    rows: tidy results rows with ``shift``, ``severity``, the filters' columns and the
      metrics (None where undefined), e.g. ``io.results.read_results(workdir)[0]``.
    variants: display label -> column filter (``{"method": "ensemble", "estimator": "raw"}``).
    ece_binning: which ECE the rows hold ("equal-mass", "equal-width"), for its y label.

  Raises:
    ValueError: malformed rows, an unknown metric or shift, a variant matching no row of the
      shift, or several rows at one severity.
  """
  rows = _check_rows(rows)
  shifts = list(dict.fromkeys(r["shift"] for r in rows if r["shift"] != CLEAN))
  if shift not in shifts:
    raise ValueError(f"shift: expected one of the rows' shifts {shifts}, got {shift!r}")
  prepared = _prepare(rows, variants, metrics, {shift}, f"shift {shift!r}", ece_binning)
  metrics, picked, compared, references, styles, ece = prepared
  fig, axes = figures.panel_row(len(metrics))
  severities = sorted({s for label in picked for s in _points(picked[label], shift)})
  # Every severity when few (0-5, 0-14 px); every other one for 0-180° in 15° steps.
  ticks = severities if len(severities) <= 8 else severities[:: -(-len(severities) // 8)]
  for ax, metric in zip(axes, metrics, strict=True):
    for label in compared:
      x, mean, std = _curve(picked[label], shift, metric)
      ax.fill_between(x, mean - std, mean + std, color=styles[label]["color"], alpha=0.15, lw=0)
      ax.plot(x, mean, markersize=4, **styles[label])
    _draw_reference_curves(ax, {label: picked[label] for label in references}, shift, metric)
    format_panel(ax, metric, ece, sep=" ")
    ax.set_xlabel(AXIS_LABELS.get(shift, f"{shift} severity (0 = clean)"))
    ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ticker.StrMethodFormatter("{x:g}"))  # picklable: drawn by workers
  _legend(fig, compared, styles, references, lambda style: Line2D([], [], markersize=4, **style))
  if title:
    fig.suptitle(title.format(shift=shift))
  return fig


def _is_corruption(shift: str) -> bool:
  return shift != CLEAN and shift not in AXIS_LABELS and not results.is_ood(shift)


def _corruption_names(rows, corruptions) -> list[str]:
  present = [name for name in dict.fromkeys(r["shift"] for r in rows) if _is_corruption(name)]
  if corruptions is None and not present:
    raise ValueError("rows: expected rows of at least one corruption, got none")
  if corruptions is None:
    return present
  if isinstance(corruptions, str) or not corruptions:
    raise ValueError(f"corruptions: expected a non-empty list of names, got {corruptions!r}")
  for name in corruptions:
    if name not in present:
      raise ValueError(f"corruptions: expected names among the rows' {present}, got {name!r}")
  return list(corruptions)


def _box_values(picked, corruptions: Sequence[str], metric: str) -> dict[float, np.ndarray]:
  """Severity -> the metric over every corruption there (severity 0: the clean row)."""
  values: dict[float, list] = {}
  for (name, severity), row in picked.items():
    if name in corruptions or name == CLEAN:
      values.setdefault(0 if name == CLEAN else severity, []).append(_value(row, metric))
  return {s: np.asarray(v)[np.isfinite(v)] for s, v in values.items()}


def _draw_boxes(ax, values, positions, width: float, color: str) -> None:
  severities = [s for s in sorted(values) if values[s].size]
  if not severities:
    return
  ax.boxplot(
    [values[s] for s in severities], positions=[positions[s] for s in severities], widths=width,
    patch_artist=True, manage_ticks=False, medianprops={"color": "black", "linewidth": 1.0},
    boxprops={"facecolor": color, "alpha": 0.6, "linewidth": 0.8}, whiskerprops={"color": color},
    capprops={"color": color},
    flierprops={"marker": ".", "markersize": 3, "markeredgecolor": color, "color": color},
  )  # fmt: skip
  single = [s for s in severities if values[s].size == 1]  # the clean row: a flat box
  if single:
    x, y = [positions[s] for s in single], [values[s][0] for s in single]
    ax.plot(x, y, linestyle="none", marker="o", markersize=4, color=color, zorder=3)


def corruption_boxes(
  rows: Sequence[Mapping[str, Any]],
  variants: Mapping[str, Mapping[str, Any]],
  metrics: Sequence[str] = ("brier", "ece"),
  *,
  corruptions: Sequence[str] | None = None,
  ece_binning: str = "equal-mass",
  title: str | None = "A box per method over {num_corruptions} corruptions at each intensity",
) -> Figure:
  """Box plots of metrics over the corruptions at each intensity (Ovadia et al., Figs. 2-3).

  One panel per metric; at each intensity (clean, then 1-5) a box per variant over every
  corruption there (the clean row: a dot). Arguments as ``shift_curves``; ``corruptions``
  picks those pooled (None: every ``shift`` but ``"clean"``, ``AXIS_LABELS``' and ``"ood_*"``).

  Raises:
    ValueError: as ``shift_curves``; also no corruption rows or an unknown corruption.
  """
  rows = _check_rows(rows)
  corruptions = _corruption_names(rows, corruptions)
  what = f"the corruptions {corruptions}"
  prepared = _prepare(rows, variants, metrics, set(corruptions), what, ece_binning)
  metrics, picked, compared, references, styles, ece = prepared
  severities = sorted({0 if n == CLEAN else s for label in picked for n, s in picked[label]})
  ticks = {s: "clean" if s == 0 else f"{s:g}" for s in severities}
  # One slot per variant at each intensity, the references' last.
  width = 0.8 / len(picked)
  positions = {
    label: {s: i + (j - (len(picked) - 1) / 2) * width for i, s in enumerate(severities)}
    for j, label in enumerate(compared + references)
  }
  fig_width = min(max(6.0, 0.14 * len(severities) * len(picked) + 2.0), figures.PAGE_WIDTH)
  fig = figures.new_figure((fig_width, 2.9 * len(metrics) + 0.6))
  axes = fig.subplots(len(metrics), 1, squeeze=False)[:, 0]
  for ax, metric in zip(axes, metrics, strict=True):
    values = {label: _box_values(picked[label], corruptions, metric) for label in picked}
    for label in compared:
      _draw_boxes(ax, values[label], positions[label], width * 0.85, styles[label]["color"])
    with _kept_limits(ax):
      for label in references:
        _draw_boxes(ax, values[label], positions[label], width * 0.85, REFERENCE_COLOR)
    _note_off_scale(ax, {label: values[label] for label in references}, ticks)
    format_panel(ax, metric, ece, sep=" ")
    ax.set_xticks(range(len(severities)), list(ticks.values()))
    ax.set(xlim=(-0.6, len(severities) - 0.4), xlabel="corruption intensity")
  _legend(
    fig, compared, styles, references,
    lambda style: Patch(facecolor=style["color"], alpha=0.6, edgecolor="black", linewidth=0.8),
  )  # fmt: skip
  if title:
    fig.suptitle(title.format(num_corruptions=len(corruptions)))
  return fig


def _check_p_correct(p_correct) -> dict[str, dict[str, np.ndarray]]:
  if not isinstance(p_correct, Mapping) or not p_correct:
    raise ValueError(
      f"p_correct: expected a non-empty dict of label -> {{set: [N]}}, got {p_correct!r:.60}"
    )
  checked = {}
  for label, sets in p_correct.items():
    if not isinstance(sets, Mapping) or not sets:
      raise ValueError(f"p_correct[{label!r}]: expected a non-empty dict of set name -> [N] array")
    checked[label] = {}
    for name, values in sets.items():
      where = f"p_correct[{label!r}][{name!r}]"
      array = np.asarray(values, np.float64)
      if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{where}: expected a non-empty [N] array, got shape {array.shape}")
      if not np.all(np.isfinite(array)) or array.min() < 0 or array.max() > 1:
        low, high, bad = np.nanmin(array), np.nanmax(array), np.sum(~np.isfinite(array))
        raise ValueError(
          f"{where}: expected probabilities in [0, 1], got [{low:.3g}, {high:.3g}], {bad} NaN/inf"
        )
      checked[label][name] = array
  return checked


def ood_histograms(
  p_correct: Mapping[str, Mapping[str, Any]],
  bins: int = 20,
  *,
  title: str | None = "Predicted P(correct) in and out of distribution",
) -> Figure:
  """Histograms of each variant's predicted P(correct) per input set (Ovadia et al., Fig. 5).

  One panel per set, ``"clean"`` first; each variant is an outline in its colour with a dotted
  line at its mean. ``p_correct``: variant label -> set name -> ``[N]`` predicted P(correct)
  (a variant may lack a set); ``bins``: equal-width bins of [0, 1] per histogram.

  Raises:
    ValueError: an empty mapping, an array that is not a non-empty [N] of probabilities
      in [0, 1], or ``bins`` not a positive int.
  """
  checked = _check_p_correct(p_correct)
  if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
    raise ValueError(f"bins: expected a positive int, got {bins!r}")
  names = list(dict.fromkeys(name for sets in checked.values() for name in sets))
  names = sorted(names, key=lambda name: name != CLEAN)  # stable: clean first, others in order
  styles = _styles(list(checked))
  edges = np.linspace(0.0, 1.0, int(bins) + 1)
  width = min(4.2 * len(names), figures.PAGE_WIDTH)
  fig = figures.new_figure((width, 4.0 + 0.15 * len(checked)))
  axes = fig.subplots(1, len(names), squeeze=False, sharex=True)[0]
  for ax, name in zip(axes, names, strict=True):
    drawn = {label: sets[name] for label, sets in checked.items() if name in sets}
    for label, values in drawn.items():
      color = styles[label]["color"]
      ax.hist(values, bins=edges, density=True, histtype="step", linewidth=1.6, color=color)
      ax.axvline(values.mean(), color=color, linestyle=":", linewidth=1.2)
    sizes = {values.size for values in drawn.values()}
    count = f"{sizes.pop():,}" if len(sizes) == 1 else "varying"
    ax.set_title(f"{'clean test set (in distribution)' if name == CLEAN else name}, N = {count}")
    ax.set(xlim=(0, 1), xlabel="predicted P(correct)", ylabel="density")
    ax.grid(alpha=0.3)
    means = [f"{label} {values.mean():.3f}" for label, values in drawn.items()]
    _note_below(ax, "\n".join(["mean P(correct):", *means]))
  handles = [Line2D([], [], color=styles[label]["color"], linewidth=1.6) for label in checked]
  handles.append(Line2D([], [], color="0.3", linestyle=":", linewidth=1.2))
  figures.legend_below(fig, handles, [*checked, "mean (dotted)"])
  if title:
    fig.suptitle(title)
  return fig


def recalibration_panels(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, float]]:
  """(shift, severity) panels: each geometric shift's and the corruptions' middle and
  largest severity."""
  panels = []
  for family in [*AXIS_LABELS, CORRUPTIONS]:
    severities = sorted({r["severity"] for r in rows if _in_family(r, family)})
    if severities:
      middle = severities[(len(severities) - 1) // 2]
      panels += [(family, s) for s in dict.fromkeys((middle, severities[-1]))]
  return panels


def _in_family(row: Mapping[str, Any], family: str) -> bool:
  return _is_corruption(row["shift"]) if family == CORRUPTIONS else row["shift"] == family


def recalibration_curves(
  rows: Sequence[Mapping[str, Any]],
  panels: Sequence[tuple[str, float]] | None = None,
  metrics: Sequence[str] = ("ece", "brier"),
  *,
  title: str | None = "Recalibrated on m labelled shifted examples ({label})",
) -> Figure:
  """Metrics against the labelled examples m, a line per recalibration (and score).

  ``rows``: one model's ``recalibration.csv`` rows. One column per (shift, severity) of
  ``panels`` (default ``recalibration_panels(rows)``; ``CORRUPTIONS``: their mean), one row
  per metric; m evenly spaced (0: the clean fit), each method's clean value dotted.
  ``{label}`` in ``title`` is the rows' ``label``.
  """
  rows = _check_rows(rows)
  metrics = _check_metrics(metrics, rows)
  panels = recalibration_panels(rows) if panels is None else list(panels)
  if not panels:
    raise ValueError("rows: expected rows of at least one shifted set, got none")
  methods = list(dict.fromkeys((r["recalibration"], r["score"]) for r in rows))
  styles = _styles([f"{name}: {score}" for name, score in methods])
  counts = sorted({r["num_labels"] for r in rows})
  fig = figures.new_figure((3.3 * len(panels), 2.9 * len(metrics) + 0.6))
  axes = fig.subplots(len(metrics), len(panels), squeeze=False)
  for (shift, severity), column in zip(panels, axes.T, strict=True):
    for metric, ax in zip(metrics, column, strict=True):
      for name, score in methods:
        style = styles[f"{name}: {score}"]
        mine = [r for r in rows if (r["recalibration"], r["score"]) == (name, score)]
        at = [r for r in mine if _in_family(r, shift) and r["severity"] == severity]
        y = [np.nanmean([_value(r, metric) for r in at if r["num_labels"] == m]) for m in counts]
        ax.plot(range(len(counts)), y, markersize=4, **style)
        clean = [r for r in mine if r["shift"] == CLEAN and r["num_labels"] == 0]
        if clean:
          ax.axhline(_value(clean[0], metric), color=style["color"], linestyle=":", linewidth=1)
      format_panel(ax, metric, ece_label="ECE")  # its title then names the panel
      ax.set_xticks(range(len(counts)), [f"{m}" for m in counts])  # one step per m given
      ax.set_xlabel("labelled shifted examples m")
      name = "corruptions (mean)" if shift == CORRUPTIONS else AXIS_LABELS[shift].split(" (")[0]
      ax.set_title(f"{name} {severity:g}", fontsize="medium")
  handles = [Line2D([], [], markersize=4, **style) for style in styles.values()]
  fig.legend(
    handles, list(styles), loc="outside lower center", ncols=min(len(styles), 4), fontsize="small"
  )
  if title:
    label = rows[0].get("label") or "model"
    fig.suptitle(title.format(label=label) + "; dotted: the clean fit on clean data")
  return fig


def accuracy_scatter(
  rows: Sequence[Mapping[str, Any]],
  titles: Mapping[str, str] | None = None,
  *,
  title: str | None = "Accuracy predicted without labels against the true accuracy ({label})",
) -> Figure:
  """Predicted against true accuracy, a point per set, a panel per estimator and score.

  ``rows``: one model's ``accuracy_estimates.csv`` rows; ``titles``: estimator name -> display
  name (None: ``accuracy_estimates.ESTIMATORS``'); ``{label}`` in ``title``: the rows' label.
  """
  rows = _check_rows(rows)
  if titles is None:
    titles = {name: entry.title for name, entry in accuracy_estimates.ESTIMATORS.items()}
  keys = list(dict.fromkeys((r["estimator"], r["score"]) for r in rows))
  # The clean set last, in black: drawn over the others.
  families = [f for f in dict.fromkeys(map(_family_of, rows)) if f != CLEAN]
  colors = _styles(families)
  if any(r["shift"] == CLEAN for r in rows):
    families.append(CLEAN)
    colors[CLEAN] = {"color": "black", "marker": "*"}
  ncols = min(4, len(keys))
  nrows = -(-len(keys) // ncols)
  fig = figures.new_figure((3.1 * ncols, 3.1 * nrows + 0.6))
  axes = fig.subplots(nrows, ncols, squeeze=False).reshape(-1)
  for ax, (estimator, score) in zip(axes, keys, strict=False):
    mine = [r for r in rows if (r["estimator"], r["score"]) == (estimator, score)]
    for family in families:
      at = [r for r in mine if _family_of(r) == family]
      x, y = [r["accuracy"] for r in at], [r["predicted_accuracy"] for r in at]
      style, size = colors[family], 8 if family == CLEAN else 4
      ax.plot(x, y, linestyle="none", marker=style["marker"], color=style["color"], markersize=size)
    ax.plot([0, 1], [0, 1], color="0.4", linewidth=0.8)
    shifted = [r["absolute_error"] for r in mine if _family_of(r) not in (CLEAN, "OOD")]
    mae = f"MAE {100 * np.mean(shifted):.1f} pp" if shifted else ""
    ax.set_title(f"{titles.get(estimator, estimator)}: {score}\n{mae}", fontsize="medium")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="true accuracy", ylabel="predicted accuracy")
    ax.set_aspect("equal")
    ax.grid(alpha=0.3)
  for ax in axes[len(keys) :]:
    ax.set_visible(False)
  handles = [
    Line2D([], [], linestyle="none", marker=colors[f]["marker"], color=colors[f]["color"])
    for f in families
  ]
  fig.legend(handles, families, loc="outside lower center", ncols=min(len(families), 5))
  if title:
    fig.suptitle(title.format(label=rows[0].get("label") or "model"))
  return fig


def _family_of(row: Mapping[str, Any]) -> str:
  """A set's family for the scatter's colours: clean, a geometric shift, corruption, OOD."""
  shift = row["shift"]
  if shift in AXIS_LABELS:
    return AXIS_LABELS[shift].split(" (")[0]
  if shift == CLEAN:
    return CLEAN
  return "OOD" if results.is_ood(shift) else "corruption"
