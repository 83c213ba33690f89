"""Figures: built from real bins and cross-validation, saved atomically, content checked."""

import os
import subprocess
import sys
import types

import matplotlib as mpl
import numpy as np
import pytest
from cycler import cycler
from matplotlib import image as mpl_image
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure

from top1_jax import plots
from top1_jax.core import binning, metrics, scores
from top1_jax.evaluation import crossval, selective
from top1_jax.plots import results as plot_results


def _scores(num, seed=0, ties=False):
  """u uniform, correct ~ Bernoulli(1 - u): P(correct) falls across the bins."""
  rng = np.random.default_rng(seed)
  u = rng.random(num).astype(np.float32)
  if ties:
    u = np.round(u * 4) / 4  # five distinct values
  return u, rng.random(num) < 1 - u


def _pair(n_bins, num=4000, seed=0, ties=False):
  u, correct = _scores(num, seed, ties)
  half = num // 2
  train = binning.fit(u[:half], correct[:half], n_bins)
  return train, binning.refit(train, u[half:], correct[half:])


@pytest.fixture(scope="module")
def pair10():
  return _pair(10)


def _check_png(path):
  assert path.exists()
  assert path.stat().st_size > 10_000
  pixels = mpl_image.imread(path)
  assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
  colours = np.unique(pixels[..., :3].reshape(-1, 3), axis=0)
  assert len(colours) > 10  # not blank, not a single colour


# --------------------------------------------------------------------------- bin_figure


def test_bin_figure_two_bars_per_bin_heights_and_widths(pair10, tmp_path):
  train, test = pair10
  fig = plots.bin_figure(train, test, title="synthetic")
  assert isinstance(fig, Figure)
  ax = fig.axes[0]
  num_bins = int(train.num_effective_bins)
  assert num_bins == 10
  assert len(ax.patches) == 2 * num_bins
  train_bars, test_bars = ax.patches[:num_bins], ax.patches[num_bins:]
  baseline = float(np.sum(test.hits) / np.sum(test.counts))
  # Bars start at the test accuracy and end at the bin's value, most confident first.
  assert all(bar.get_y() == pytest.approx(baseline) for bar in ax.patches)
  assert min(b.get_height() for b in train_bars) < 0 < max(b.get_height() for b in train_bars)
  tops = np.array([b.get_y() + b.get_height() for b in train_bars])
  order = np.argsort(-np.asarray(train.prob))
  np.testing.assert_allclose(tops, np.asarray(train.prob)[order], rtol=1e-6)
  assert np.all(np.diff(tops) <= 0)
  test_tops = np.array([b.get_y() + b.get_height() for b in test_bars])
  np.testing.assert_allclose(test_tops, np.asarray(test.accuracy)[order], rtol=1e-5)
  # Equal-count bins: equal widths that tile [0, 1]; test bars sit inside their bin.
  widths = np.array([b.get_width() for b in train_bars])
  np.testing.assert_allclose(widths, 0.1, rtol=1e-6)
  for outer, inner in zip(train_bars, test_bars, strict=True):
    assert (
      outer.get_x()
      < inner.get_x()
      < inner.get_x() + inner.get_width()
      < (outer.get_x() + outer.get_width())
    )
  # The baseline, the ECE and the intervals are on the plot.
  assert any(np.allclose(line.get_ydata(), baseline) for line in ax.lines)
  legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
  # Which ECE, over how many bins: the equal-mass calibration bins, not equal-width ones.
  name = "ECE (10 equal-mass calibration-split bins)"
  assert f"{name} = {metrics.binned_ece(train, test):.2%}" in legend
  assert "95% Clopper–Pearson" in legend
  (errorbars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
  segments = errorbars.lines[2][0].get_segments()
  lower, upper = binning.confidence_bounds(train, 0.05)
  np.testing.assert_allclose([s[0][1] for s in segments], np.asarray(lower)[order], atol=1e-6)
  np.testing.assert_allclose([s[1][1] for s in segments], np.asarray(upper)[order], atol=1e-6)
  assert ax.get_title() == "synthetic"

  path = plots.save_figure(fig, tmp_path / "bins.png")
  assert path == tmp_path / "bins.png"
  _check_png(path)


def test_bin_figure_ties_widths_follow_weights_and_bin_order():
  train, test = _pair(10, ties=True)
  num_bins = int(train.num_effective_bins)
  assert num_bins < 10  # merged tie groups
  fig = Figure()
  ax = fig.add_subplot()
  returned = plots.bin_figure(
    train,
    test,
    ax=ax,
    order="bins",
    bounds="hoeffding",
    accuracy=0.5,
    annotate=False,
    event="Top-5",
  )
  assert ax.get_ylabel() == "P(Top-5 prediction correct)"
  assert ax.get_title() == (
    f"Calibrated Top-5 bins (10 equal-mass bins requested, {num_bins} after ties)"
  )
  assert returned is fig
  assert len(ax.patches) == 2 * num_bins
  train_bars = ax.patches[:num_bins]
  counts = np.asarray(train.counts)[:num_bins]
  np.testing.assert_allclose([b.get_width() for b in train_bars], counts / counts.sum(), rtol=1e-6)
  # Bin order (ascending u): the first bar is the lowest-u bin.
  np.testing.assert_allclose(
    [b.get_y() + b.get_height() for b in train_bars], np.asarray(train.prob)[:num_bins], rtol=1e-6
  )
  assert all(b.get_y() == pytest.approx(0.5) for b in ax.patches)
  legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
  assert "Hoeffding" in legend and "50.0%" in legend
  assert f"ECE (10 equal-mass calibration-split bins requested, {num_bins} after ties)" in legend
  # A title of one's own, with the bin counts filled in.
  fig = plots.bin_figure(train, test, title="mine: {event}, {bins}", event="Top-5")
  assert (
    fig.axes[0].get_title() == f"mine: Top-5, 10 equal-mass bins requested, {num_bins} after ties"
  )


def test_bin_figure_empty_test_bin_and_no_bounds(pair10, tmp_path):
  train = pair10[0]
  u, correct = _scores(2000, seed=2)
  # Squeezed above 0.3 (same length, so no recompilation): the lowest-u bins stay empty.
  test = binning.refit(train, 0.3 + 0.7 * u, correct)
  nonempty = int(np.sum(np.asarray(test.counts) > 0))
  assert nonempty < 10
  fig = plots.bin_figure(train, test, bounds=None)
  ax = fig.axes[0]
  assert len(ax.patches) == 10 + nonempty
  assert not [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
  assert np.all(np.isfinite([p.get_height() for p in ax.patches]))
  _check_png(plots.save_figure(fig, tmp_path / "empty.png"))


def test_bin_figure_validation(pair10):
  train, test = pair10
  other_train, other_test = _pair(40)
  with pytest.raises(ValueError, match="test_bins: expected 10 bins"):
    plots.bin_figure(train, other_test)
  with pytest.raises(ValueError, match="test_bins: bin edges differ"):
    plots.bin_figure(train, _pair(10, seed=1)[1])
  with pytest.raises(ValueError, match="train_bins: expected binning.Bins"):
    plots.bin_figure({"counts": 1}, test)
  with pytest.raises(ValueError, match="bounds"):
    plots.bin_figure(train, test, bounds="wald")
  with pytest.raises(ValueError, match="order"):
    plots.bin_figure(train, test, order="random")
  with pytest.raises(ValueError, match="delta"):
    plots.bin_figure(train, test, delta=1.5)
  with pytest.raises(ValueError, match="accuracy"):
    plots.bin_figure(train, test, accuracy=2.0)
  assert other_train.n_bins == 40


# --------------------------------------------------------------------------- refinement


def test_refinement_figure(pair10, tmp_path):
  fine = _pair(40)
  fig = plots.refinement_figure(pair10, fine)
  coarse_ax, fine_ax = fig.axes
  assert len(coarse_ax.patches) == 2 * 10
  # 40 bars of each kind, plus the coarse predictions traced as one step patch.
  steps = [p for p in fine_ax.patches if type(p).__name__ == "StepPatch"]
  assert len(steps) == 1
  assert len(fine_ax.patches) == 2 * int(fine[0].num_effective_bins) + 1
  np.testing.assert_allclose(
    steps[0].get_data().values, np.sort(np.asarray(pair10[0].prob))[::-1], rtol=1e-6
  )
  assert coarse_ax.get_ylim() == fine_ax.get_ylim()
  # The title says what the panels show, each ECE named and given (not that more bins win).
  coarse_ece, fine_ece = metrics.binned_ece(*pair10), metrics.binned_ece(*fine)
  assert fig.get_suptitle() == (
    "10 vs 40 bins of one score: more bins resolve P(correct) more finely, each from fewer "
    "examples\nECE (each panel's equal-mass calibration-split bins): "
    f"{coarse_ece:.2%} with 10, {fine_ece:.2%} with 40"
  )
  assert not plots.refinement_figure(pair10, fine, title="").get_suptitle()
  assert [coarse_ax.get_title(), fine_ax.get_title()] == [
    "10 equal-mass bins",
    "40 equal-mass bins",
  ]
  # The step line has no closing edges: no vertical segment at either end of the axis.
  path = steps[0].get_path()
  for (x0, y0), (x1, y1) in zip(path.vertices[:-1], path.vertices[1:], strict=True):
    if x0 == x1 and x0 in (0.0, 1.0):
      assert y0 == y1, f"vertical segment at x = {x0}"
  _check_png(plots.save_figure(fig, tmp_path / "refine.png"))


def test_refinement_figure_validation(pair10):
  with pytest.raises(ValueError, match=r"fine\[1\]: expected 40 bins"):
    plots.refinement_figure(pair10, (_pair(40)[0], pair10[1]))
  with pytest.raises(ValueError, match="coarse: expected a"):
    plots.refinement_figure(pair10[0], pair10)


# --------------------------------------------------------------------------- ablation


@pytest.fixture(scope="module")
def ablation_results():
  u, correct = _scores(3000)
  noisy = u + np.random.default_rng(1).normal(0, 0.3, u.shape).astype(np.float32)
  splits = crossval.make_splits(u.shape[0], 4, seed=0)
  n_bins = (5, 10, 20, 50)
  return {
    "u": crossval.cross_validate(u, correct, n_bins=n_bins, splits=splits),
    "u + noise": crossval.cross_validate(noisy, correct, n_bins=n_bins, splits=splits),
  }


def test_ablation_figure(ablation_results, tmp_path):
  fig = plots.ablation_figure(ablation_results)
  assert len(fig.axes) == 3
  for ax, metric in zip(fig.axes, ("brier", "ece", "eor"), strict=True):
    assert ax.get_xscale() == "log"
    assert len(ax.lines) == 2  # one per score; the ± std bars are line collections
    # Bars, not shaded bands (ten bands hid one another), each line's beside the other's:
    # the lines' points are shifted apart along x by a few percent of the bin count.
    assert [type(c).__name__ for c in ax.collections] == ["LineCollection"] * 2
    shifts = []
    for line, bars, result in zip(ax.lines, ax.collections, ablation_results.values(), strict=True):
      ratio = np.asarray(line.get_xdata()) / np.asarray(result.n_bins)
      assert np.allclose(ratio, ratio[0]) and 0.85 < ratio[0] < 1.15
      shifts.append(ratio[0])
      np.testing.assert_allclose(line.get_ydata(), result.mean[metric], rtol=1e-6)
      lows = [segment[0][1] for segment in bars.get_segments()]
      np.testing.assert_allclose(lows, result.mean[metric] - result.std[metric], rtol=1e-5)
    assert shifts[0] < 1 < shifts[1]
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels == ["u", "u + noise"]
  _check_png(plots.save_figure(fig, tmp_path / "ablation.png"))


def _fake_cv(seed, n_bins=(5, 10, 20)):
  """A CrossValidation with random per-split metrics (no binning needed to draw lines)."""
  rng = np.random.default_rng(seed)
  per_fold = {m: rng.random((len(n_bins), 3)) for m in ("brier", "ece", "eor")}
  return crossval.CrossValidation.from_per_fold(n_bins, per_fold)


def test_ablation_figure_merges_identical_curves(ablation_results):
  same = ablation_results["u"]
  copy = crossval.CrossValidation.from_per_fold(
    same.n_bins, {m: v.copy() for m, v in same.per_fold.items()}
  )
  results = {"model: pmax": same, "model: u + noise": ablation_results["u + noise"]}
  results["model: −log pmax"] = copy
  fig = plots.ablation_figure(results)
  for ax in fig.axes:
    assert len(ax.lines) == 2 and len(ax.collections) == 2
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels == ["model: pmax = −log pmax", "model: u + noise"]
  # Equal in all but one split of one metric: two lines.
  per_fold = {m: v.copy() for m, v in same.per_fold.items()}
  per_fold["auroc"][0, 0] += 1e-6
  near = crossval.CrossValidation.from_per_fold(same.n_bins, per_fold)
  fig = plots.ablation_figure({"a": same, "b": near})
  assert len(fig.axes[0].lines) == 2


def _saturated_twins(num=4000, seed=3):
  """A network whose float32 pmax rounds to 1.0 for a third of the examples (top logit
  17-30 ahead): a figures source, and the cross-validation records of pmax and -log pmax."""
  rng = np.random.default_rng(seed)
  logits = np.zeros((num, 10), np.float32)
  logits[:, 0] = rng.uniform(2, 30, num).astype(np.float32)
  correct = rng.random(num) < 1 / (1 + np.exp(-(logits[:, 0] - 6) / 4))
  values = {name: np.asarray(v) for name, v in scores.compute(logits).items()}
  splits = crossval.make_splits(num, 4, seed=0)
  source = types.SimpleNamespace(
    name="net", label="net", slug="net", splits=splits, scores=values, correct=lambda k: correct
  )
  records = []
  for name in ("pmax", "neg_log_pmax"):
    cv = crossval.cross_validate(values[name], correct, n_bins=(5, 20), splits=splits)
    records.append({
      "topk": 1, "columns": {"method": "deterministic"}, "score": name, "source": "net",
      "rows": [{"n_bins": n} for n in cv.n_bins], "per_fold": cv.per_fold,
    })  # fmt: skip
  return source, records


def test_ranking_twins_share_a_legend_entry_only_where_their_rows_are_equal(monkeypatch, tmp_path):
  source, records = _saturated_twins()
  pmax, neg_log = (crossval.CrossValidation.from_per_fold((5, 20), r["per_fold"]) for r in records)
  # Ties at pmax = 1.0 leave pmax fewer bins, and different metrics, than -log pmax.
  assert pmax.mean["num_effective_bins"][1] < neg_log.mean["num_effective_bins"][1] == 20
  assert not np.allclose(pmax.mean["eor"], neg_log.mean["eor"])
  drawn = {}
  monkeypatch.setattr(plot_results, "save_figure", lambda fig, path: drawn.update({path.name: fig}))

  def ablation_legend(records):
    plots.write_figures(tmp_path, [source], records, (5, 20), (1,), 6)
    texts = drawn["ablation_top1.png"].legends[0].get_texts()
    return [text.get_text().split(" (ties")[0] for text in texts]

  assert ablation_legend(records) == ["net: pmax (Vanilla)", "net: −log pmax"]
  # Rows that are equal (here a copy) are one line, labelled with both names.
  equal = [records[0], {**records[0], "score": "neg_log_pmax"}]
  assert ablation_legend(equal) == ["net: pmax (Vanilla) = −log pmax"]


def test_ablation_figure_more_lines_than_colours_all_distinct():
  # Three colours, four dash patterns: up to 12 lines can differ.
  few = {f"score {i}": _fake_cv(i) for i in range(11)}
  with mpl.rc_context({"axes.prop_cycle": cycler(color=["red", "green", "blue"])}):
    fig = plots.ablation_figure(few)
  for ax in fig.axes:
    assert len(ax.lines) == 11
    pairs = {(line.get_color(), line.get_linestyle()) for line in ax.lines}
    assert len(pairs) == 11
    assert {color for color, _ in pairs} == {"red", "green", "blue"}
  legend_lines = fig.legends[0].get_lines()
  assert len({(h.get_color(), h.get_linestyle()) for h in legend_lines}) == 11
  # The default cycle (10 colours): 13 lines are still 13 distinct (colour, dash) pairs.
  results = {f"score {i}": _fake_cv(i) for i in range(13)}
  fig = plots.ablation_figure(results)
  pairs = {(line.get_color(), line.get_linestyle()) for line in fig.axes[0].lines}
  assert len(pairs) == 13


def test_ablation_figure_validation(ablation_results):
  with pytest.raises(ValueError, match="results: expected a non-empty"):
    plots.ablation_figure({})
  with pytest.raises(ValueError, match=r"results\['x'\]"):
    plots.ablation_figure({"x": [1, 2]})
  with pytest.raises(ValueError, match="metrics"):
    plots.ablation_figure(ablation_results, metrics=("brier", "f1"))
  one = plots.ablation_figure(ablation_results, metrics=("auroc",), title=None)
  assert len(one.axes) == 1


def _oracle_cv():
  """An oracle-like reference: its score is (almost) the label, far below every real Brier."""
  u, correct = _scores(3000)
  oracle = (~correct).astype(np.float32) + np.random.default_rng(2).random(u.shape) * 0.01
  splits = crossval.make_splits(u.shape[0], 4, seed=0)
  return crossval.cross_validate(oracle, correct, n_bins=(5, 10, 20, 50), splits=splits)


def test_ablation_figure_oracle_is_a_grey_reference_that_leaves_the_axes(ablation_results):
  oracle = _oracle_cv()
  name = "model: oracle (needs labels)"
  plain = plots.ablation_figure(ablation_results)
  fig = plots.ablation_figure(ablation_results, references={name: oracle})
  for ax, alone, metric in zip(fig.axes, plain.axes, ("brier", "ece", "eor"), strict=True):
    # The compared scores set the limits, with or without the reference.
    assert ax.get_ylim() == alone.get_ylim()
    (line,) = [line for line in ax.lines if line.get_label() == name]
    assert line.get_color() == "0.55" and line.get_linewidth() == 1.0
    np.testing.assert_allclose(line.get_ydata(), oracle.mean[metric], rtol=1e-6)
  brier_ax = fig.axes[0]
  assert max(oracle.mean["brier"]) < brier_ax.get_ylim()[0]  # below every real score
  (note,) = brier_ax.texts
  text = note.get_text().replace("\n", " ")  # wrapped to the panel's width
  assert text.startswith(f"{name}: ") and "(off scale below)" in text
  assert "at 5, 10, 20, 50 bins" in text
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels == ["u", "u + noise", name]
  with pytest.raises(ValueError, match=r"references\['o'\]: expected crossval.CrossValidation"):
    plots.ablation_figure(ablation_results, references={"o": [1]})
  with pytest.raises(ValueError, match="references: expected a dict"):
    plots.ablation_figure(ablation_results, references=[oracle])


def test_ablation_figure_says_which_ece_and_bins_after_ties(ablation_results):
  fig = plots.ablation_figure(ablation_results)
  assert fig.axes[1].get_ylabel() == "ECE % (N equal-mass calibration-split bins)"
  assert fig.axes[0].get_xlabel() == "N: number of bins (requested)"
  # Five distinct scores: 10 and 20 bins requested leave 5 after ties (every split).
  u, correct = _scores(2000, ties=True)
  splits = crossval.make_splits(u.shape[0], 4, seed=0)
  tied = crossval.cross_validate(u, correct, n_bins=(2, 10, 20), splits=splits)
  np.testing.assert_array_equal(tied.mean["num_effective_bins"], [2, 5, 5])
  fig = plots.ablation_figure({"u": tied})
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["u (ties: 10→5, 20→5 bins)"]


# --------------------------------------------------------------------------- dropout rate


def _sweep_rows(models=("cnn",), rates=(0.1, 0.01, 0.05), n_bins=(5, 20), mc_scores=None):
  """Tidy results rows: a deterministic pmax row and MC-dropout rows per model and bin count."""
  rng = np.random.default_rng(0)
  mc_scores = mc_scores or ("pmax", "covariance_norm_probs")
  points = [("deterministic", 0.0, "pmax")]
  points += [("mc_dropout", rate, score) for rate in rates for score in mc_scores]
  points += [("ensemble", 0.0, "pmax")]
  rows = []
  for model in models:
    for method, rate, score in points:
      for bins in n_bins:
        row = {"dataset": "d", "model": model, "method": method, "train_dropout_rate": 0.1}
        row |= {"dropout_rate": rate, "num_samples": 10, "ensemble_size": 0, "seed": 0}
        row |= {"score": score, "topk": 1, "estimator": "bins", "n_bins": bins}
        for metric in crossval.METRICS:
          row[metric], row[f"{metric}_std"] = float(rng.random()), float(rng.random() / 20)
        row["num_effective_bins"], row["num_effective_bins_std"] = float(bins), 0.0
        rows.append(row)
  return rows


def test_dropout_rate_figure_lines_error_bars_and_reference(tmp_path):
  rows = _sweep_rows()
  rows[-3]["auroc"] = None  # an undefined point is a gap, not an error
  fig = plots.dropout_rate_figure(rows)
  assert "cov. 2-norm (probs)" in fig.get_suptitle()  # the headline score by default
  assert len(fig.axes) == 3
  for ax, metric in zip(fig.axes, ("brier", "ece", "auroc"), strict=True):
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "test-time dropout rate"
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [bar.get_label() for bar in bars] == ["5 bins", "20 bins"]
    for bar, bins in zip(bars, (5, 20), strict=True):
      points = [
        r
        for r in rows
        if r["method"] == "mc_dropout"
        and r["n_bins"] == bins
        and r["score"] == "covariance_norm_probs"
      ]
      points.sort(key=lambda r: r["dropout_rate"])
      line = bar.lines[0]
      np.testing.assert_array_equal(line.get_xdata(), [0.01, 0.05, 0.1])
      expected = [np.nan if r[metric] is None else r[metric] for r in points]
      np.testing.assert_allclose(np.asarray(line.get_ydata(), float), expected)
      segments = bar.lines[2][0].get_segments()  # the vertical error bars: mean ± std
      half = [abs(seg[1][1] - seg[0][1]) / 2 if len(seg) else np.nan for seg in segments]
      stds = [np.nan if r[metric] is None else r[f"{metric}_std"] for r in points]
      np.testing.assert_allclose(half, stds, rtol=1e-6)
    references = [line for line in ax.lines if line.get_linestyle() == ":"]
    deterministic = [r[metric] for r in rows if r["method"] == "deterministic"]
    assert [line.get_ydata()[0] for line in references] == pytest.approx(deterministic)
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels == ["5 bins", "20 bins", "deterministic (pmax (Vanilla))"]
  _check_png(plots.save_figure(fig, tmp_path / "dropout_rate.png"))


def test_dropout_rate_figure_score_models_and_errors():
  rows = _sweep_rows(models=("cnn", "mlp"), rates=(0.05,), n_bins=(10,), mc_scores=("entropy",))
  fig = plots.dropout_rate_figure(rows, metrics=("nll",), title=None)  # entropy: the only one
  assert fig.get_suptitle() == "" and len(fig.axes) == 1
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels == ["cnn: 10 bins", "mlp: 10 bins", "deterministic (pmax (Vanilla))"]
  with pytest.raises(ValueError, match="no mc_dropout rows .* for top-2"):
    plots.dropout_rate_figure(rows, topk=2)
  no_mc = [r for r in rows if r["method"] != "mc_dropout"]
  with pytest.raises(ValueError, match="no mc_dropout rows"):
    plots.dropout_rate_figure(no_mc)
  with pytest.raises(ValueError, match="score: expected one of .*'entropy'"):
    plots.dropout_rate_figure(rows, score="pmax")
  with pytest.raises(ValueError, match="metrics"):
    plots.dropout_rate_figure(rows, metrics=("f1",))
  with pytest.raises(ValueError, match="rows: expected a list of dicts"):
    plots.dropout_rate_figure(rows[0])


# --------------------------------------------------------------------------- reliability


def _confidences(num, seed=0):
  """Distinct confidences in [0.1, 1); correct ~ Bernoulli(conf ** 2): overconfident."""
  rng = np.random.default_rng(seed)
  confidence = (0.1 + 0.9 * rng.random(num)).astype(np.float32)
  assert np.unique(confidence).size == num
  return confidence, rng.random(num) < confidence.astype(np.float64) ** 2


def _reliability_artists(fig):
  diagram_ax, counts_ax = fig.axes
  (points,) = [line for line in diagram_ax.lines if line.get_label().startswith("accuracy")]
  return diagram_ax, counts_ax, points


def test_reliability_diagram_matches_numpy_equal_count_bins(tmp_path):
  num, n_bins = 3000, 15
  confidence, correct = _confidences(num)
  fig = plots.reliability_diagram(confidence, correct, n_bins, title="synthetic")
  diagram_ax, counts_ax, points = _reliability_artists(fig)
  # Equal-count bins by hand: sorted positions [floor(b M / n), floor((b + 1) M / n)).
  order = np.argsort(confidence, kind="stable")
  bounds = np.arange(n_bins + 1) * num // n_bins
  members = [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
  mean_conf = np.array([confidence[m].astype(np.float64).mean() for m in members])
  accuracy = np.array([correct[m].mean() for m in members])
  counts = np.diff(bounds)
  np.testing.assert_allclose(points.get_xdata(), mean_conf, rtol=1e-6)
  np.testing.assert_allclose(points.get_ydata(), accuracy, rtol=1e-12)
  heights = np.array([bar.get_height() for bar in counts_ax.patches])
  np.testing.assert_array_equal(heights, counts)
  assert heights.sum() == num
  ece = np.sum(counts / num * np.abs(accuracy - mean_conf))
  assert points.get_label() == f"accuracy per bin; ECE (15 equal-mass bins) = {ece:.2%}"
  assert (
    f"ECE (15 equal-mass bins) = {ece:.2%}" in diagram_ax.get_legend().get_texts()[2].get_text()
  )
  # The diagonal, and each gap drawn from it to the bin's point.
  assert any(list(line.get_xydata().ravel()) == [0, 0, 1, 1] for line in diagram_ax.lines)
  (gaps,) = [c for c in diagram_ax.collections if c.get_label() == "gap to diagonal"]
  for ((x0, y0), (x1, y1)), acc in zip(gaps.get_segments(), accuracy, strict=True):
    assert x0 == x1 == pytest.approx(y0) and y1 == pytest.approx(acc, rel=1e-12)
  assert diagram_ax.get_title() == "synthetic"
  assert diagram_ax.get_xlim() == diagram_ax.get_ylim() == counts_ax.get_xlim()
  _check_png(plots.save_figure(fig, tmp_path / "reliability.png"))


def test_reliability_diagram_ties_merge_bins_and_counts_add_up():
  confidence, correct = _confidences(2000, seed=3)
  confidence[:700] = 1.0  # saturated max-softmax: one tied bin
  fig = plots.reliability_diagram(confidence, correct, 10, delta=None)
  diagram_ax, counts_ax, points = _reliability_artists(fig)
  heights = np.array([bar.get_height() for bar in counts_ax.patches])
  # Edges at ranks 200, 400, ...: those from rank 1400 on are all 1.0 and merge, so the
  # last bin runs from the edge at rank 1200 up to 1.0 and holds 800 examples.
  np.testing.assert_array_equal(heights, [200] * 6 + [800])
  assert len(points.get_xdata()) == 7
  assert points.get_xdata()[-1] == pytest.approx((np.sort(confidence)[1200:].sum()) / 800)
  # Requested and effective bin counts, in the title, the counts panel and the ECE's name.
  assert (
    diagram_ax.get_title() == "Reliability diagram (10 equal-mass bins requested, 7 after ties)"
  )
  assert counts_ax.texts[0].get_text().startswith("10 bins requested, 7 after ties; 200–800")
  name = "ECE (10 equal-mass bins requested, 7 after ties)"
  assert points.get_label().startswith(f"accuracy per bin; {name} = ")
  assert not diagram_ax.containers  # no error bars with delta=None


def test_reliability_diagram_equal_width_spreads_a_saturated_softmax():
  # A saturated network: most max-softmax values in (0.97, 1]. Equal-mass bins put most of
  # the points there; equal-width bins (the benchmark's ECE bins) spread them out.
  rng = np.random.default_rng(4)
  confidence = np.concatenate([rng.uniform(0.97, 1.0, 1600), rng.uniform(0.2, 0.97, 400)])
  correct = rng.random(2000) < confidence
  crowded = _reliability_artists(plots.reliability_diagram(confidence, correct, 15))[2]
  assert np.sum(crowded.get_xdata() > 0.97) >= 10
  fig = plots.reliability_diagram(confidence, correct, 15, binning="equal-width")
  diagram_ax, counts_ax, points = _reliability_artists(fig)
  assert np.sum(points.get_xdata() > 0.97) == 1
  # The benchmark's bins and ECE: metrics.ece, right-closed bins of width 1/15.
  index = np.clip(np.ceil(confidence * 15).astype(int) - 1, 0, 14)
  used = np.flatnonzero(np.bincount(index, minlength=15))
  mean_conf = [confidence[index == b].mean() for b in used]
  np.testing.assert_allclose(points.get_xdata(), mean_conf, rtol=1e-6)
  np.testing.assert_allclose(points.get_ydata(), [correct[index == b].mean() for b in used])
  ece = metrics.ece(confidence, correct, 15)
  assert points.get_label() == f"accuracy per bin; ECE (15 equal-width bins) = {ece:.2%}"
  assert diagram_ax.get_title() == "Reliability diagram (15 equal-width bins)"
  assert counts_ax.texts[0].get_text().startswith(f"{used.size} of 15 bins hold examples")
  with pytest.raises(ValueError, match="binning: expected one of"):
    plots.reliability_diagram(confidence, correct, binning="quantile")


def test_wide_figures_fit_the_page_with_readable_legends(ablation_results, tmp_path):
  # The page shows a figure at most ~1,150 px wide: no figure is wider than
  # figures.PAGE_WIDTH inches, so its "small" legend text stays >= 12 px there.
  from top1_jax.plots import figures

  many = {f"a long score name number {i}": _fake_cv(i) for i in range(9)}
  drawn = {
    "ablation": plots.ablation_figure(many, references={"oracle (needs labels)": _fake_cv(9)}),
    "refinement": plots.refinement_figure(_pair(10), _pair(40)),
    "dropout_rate": plots.dropout_rate_figure(_sweep_rows(models=("cnn", "mlp"))),
  }
  for name, fig in drawn.items():
    path = plots.save_figure(fig, tmp_path / f"{name}.png", dpi=100)
    width = mpl_image.imread(path).shape[1] / 100
    assert width <= figures.PAGE_WIDTH + 0.2, (name, width)
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]:
      sizes = {text.get_fontsize() for text in legend.get_texts()}
      assert min(sizes) * (1150 / 72) / figures.PAGE_WIDTH >= 12, (name, sizes)


@pytest.mark.parametrize(
  ("confidence", "correct", "kwargs", "message"),
  [
    ([0.5, np.nan, 0.9], [1, 0, 1], {}, "confidence: 1 non-finite value"),
    ([0.5, 0.6, 0.9], [1, 0, 1, 1], {}, "length mismatch: confidence has 3, correct has 4"),
    ([0.5, 1.2, 0.9], [1, 0, 1], {}, r"confidence: probabilities must lie in \[0, 1\]"),
    ([0.5, 0.6, 0.9], [1, 2, 1], {}, "correct: expected bool or 0/1"),
    ([], [], {}, "confidence: expected at least one example"),
    ([0.5, 0.6, 0.9], [1, 0, 1], {"n_bins": 4}, "n_bins: expected at least 1, at most 3"),
    ([0.5, 0.6, 0.9], [1, 0, 1], {"n_bins": 2, "delta": 1.0}, "delta: expected a value"),
  ],
)
def test_reliability_diagram_validation(confidence, correct, kwargs, message):
  with pytest.raises(ValueError, match=message) as error:
    plots.reliability_diagram(confidence, correct, **kwargs)
  assert "\n" not in str(error.value)


def test_dropout_rate_figure_says_which_ece_and_bins_after_ties():
  rows = _sweep_rows(rates=(0.01, 0.1))
  for row in rows:
    if row["n_bins"] == 20 and row["method"] == "mc_dropout":
      row["num_effective_bins"] = 17.25 if row["dropout_rate"] == 0.01 else 18.0
  fig = plots.dropout_rate_figure(rows)
  assert fig.axes[1].get_ylabel() == "ECE % (each line's equal-mass calibration-split bins)"
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert labels[:2] == ["5 bins", "20 bins requested, 17.2–18 after ties"]


def test_bins_phrase_and_the_one_ece_name():
  assert metrics.bins_phrase(15, 15, "equal-mass") == "15 equal-mass bins"
  assert metrics.bins_phrase(15, 12) == "15 bins requested, 12 after ties"
  assert metrics.bins_phrase(100, 73.5, "equal-mass") == (
    "100 equal-mass bins requested, 73.5 after ties"
  )
  assert metrics.ece_name(15, "equal-width") == "ECE (15 equal-width bins)"
  assert metrics.ece_name(20, "equal-mass", 17, calibration=True, percent=True) == (
    "ECE % (20 equal-mass calibration-split bins requested, 17 after ties)"
  )
  assert metrics.ece_name("N", "equal-mass", calibration=True) == (
    "ECE (N equal-mass calibration-split bins)"
  )


# --------------------------------------------------------------------------- risk-coverage


def test_risk_coverage_figure_every_line_style_in_the_legend(tmp_path):
  u, correct = _scores(500)
  curve = selective.risk_coverage(u, correct)
  points = [
    plots.OperatingPoint(0.8, 0.5, 0.85, 0.82),
    plots.OperatingPoint(0.9, 0.2, 0.93, None),  # selected, no bound reported
    plots.OperatingPoint(0.99, 0.0, None, None),  # nothing selected
  ]
  fig = plots.risk_coverage_figure(curve, points, title="synthetic")
  ax = fig.axes[0]
  legend = ax.get_legend()
  shown = {line.get_linestyle() for line in ax.lines if len(line.get_xdata())}
  in_legend = {handle.get_linestyle() for handle in legend.legend_handles}
  assert {"-", "--"} <= shown
  assert shown <= in_legend  # every drawn line style is explained
  texts = [t.get_text() for t in legend.get_texts()]
  assert "dashed line: target risk, 1 − target" in texts
  assert "short bar at its coverage: guaranteed risk, 1 − bound" in texts
  _check_png(plots.save_figure(fig, tmp_path / "risk.png"))
  # The guarantee is a short bar at its point's coverage, not a line across the panel that
  # would lie on the target's: target 0.8 (risk 0.2) dashed across, bound 0.82 (0.18) a bar.
  (bar,) = [line for line in ax.lines if line.get_linewidth() == 3.0 and len(line.get_xdata())]
  np.testing.assert_allclose(bar.get_xdata(), [0.46, 0.54])
  np.testing.assert_allclose(bar.get_ydata(), [0.18, 0.18])
  assert bar.get_linestyle() == "-"
  targets = [line for line in ax.lines if line.get_linestyle() == "--" and len(line.get_xdata())]
  assert sorted(round(1 - line.get_ydata()[0], 6) for line in targets) == [0.8, 0.9, 0.99]
  # Without a guarantee drawn, no bar entry; without points, no dashed one either.
  fig = plots.risk_coverage_figure(curve, points[1:])
  assert not any("short bar" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
  fig = plots.risk_coverage_figure(curve)
  assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
    "risk among the most confident"
  ]


# --------------------------------------------------------------------------- images


def _images(num, channels, seed=0):
  rng = np.random.default_rng(seed)
  # Smooth gradients plus noise: many colours, in [0, 1].
  ramp = np.linspace(0, 1, 16)[None, :, None, None] * np.ones((num, 16, 16, channels))
  return np.clip(0.7 * ramp + 0.3 * rng.random((num, 16, 16, channels)), 0, 1).astype(np.float32)


CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "a very long class name indeed")


def test_image_grid_grayscale(tmp_path):
  num = 10
  given = np.arange(num) % 6
  predicted = (given + 1) % 6
  probs = np.linspace(0.9, 0.99999, num)
  probs[0] = 0.998
  fig = plots.image_grid(_images(num, 1), given, predicted, probs, CLASSES, columns=4, title="t")
  assert len(fig.axes) == num
  titles = [ax.get_title() for ax in fig.axes]
  assert titles[0] == "given: airplane\npred: automobile\np=0.998"
  assert "p=0.99999" in titles[-1]  # not rounded up to 1.000
  assert "given: a very long class…" in titles[5]
  for ax in fig.axes:
    (shown,) = ax.get_images()
    assert shown.get_array().shape == (16, 16)
    assert shown.get_cmap().name == "gray"
  rows = {round(ax.get_position().y0, 3) for ax in fig.axes}
  assert len(rows) == 3  # 4 + 4 + 2
  _check_png(plots.save_figure(fig, tmp_path / "grid.png"))


def test_image_grid_rgb_and_validation():
  images = _images(3, 3)
  fig = plots.image_grid(images, [0, 1, 2], [0, 2, 1], [0.5, 0.6, 0.7], CLASSES)
  assert len(fig.axes) == 3
  assert fig.axes[0].get_images()[0].get_array().shape == (16, 16, 3)
  with pytest.raises(ValueError, match="given_labels: expected 3 entries"):
    plots.image_grid(images, [0, 1], [0, 2, 1], [0.5, 0.6, 0.7], CLASSES)
  with pytest.raises(ValueError, match="predicted_labels: labels out of range"):
    plots.image_grid(images, [0, 1, 2], [0, 2, 6], [0.5, 0.6, 0.7], CLASSES)
  with pytest.raises(ValueError, match="probs: expected shape"):
    plots.image_grid(images, [0, 1, 2], [0, 2, 1], [0.5, 0.6], CLASSES)
  with pytest.raises(ValueError, match="probs: expected probabilities"):
    plots.image_grid(images, [0, 1, 2], [0, 2, 1], [0.5, 0.6, 1.5], CLASSES)
  with pytest.raises(ValueError, match=r"images: expected \[N, H, W, C\]"):
    plots.image_grid(images[..., 0], [0, 1, 2], [0, 2, 1], [0.5, 0.6, 0.7], CLASSES)
  with pytest.raises(ValueError, match="images: expected finite values in"):
    plots.image_grid(images * 255, [0, 1, 2], [0, 2, 1], [0.5, 0.6, 0.7], CLASSES)
  with pytest.raises(ValueError, match="images: expected at least one"):
    plots.image_grid(images[:0], [], [], [], CLASSES)
  with pytest.raises(ValueError, match="class_names"):
    plots.image_grid(images, [0, 1, 2], [0, 2, 1], [0.5, 0.6, 0.7], "abc")


# --------------------------------------------------------------------------- saving


def _small_figure():
  fig = Figure(figsize=(2, 2))
  fig.add_subplot().plot([0, 1], [1, 0])
  return fig


def test_save_figure_creates_directories_and_formats(tmp_path):
  path = plots.save_figure(_small_figure(), str(tmp_path / "a" / "b" / "fig.svg"))
  assert path.read_text().lstrip().startswith("<?xml")
  assert os.listdir(path.parent) == ["fig.svg"]
  with pytest.raises(ValueError, match="path: expected a suffix"):
    plots.save_figure(_small_figure(), tmp_path / "new" / "fig.xyz")
  assert not (tmp_path / "new").exists()  # refused before any folder is made
  with pytest.raises(ValueError, match="fig: expected a matplotlib Figure"):
    plots.save_figure("not a figure", tmp_path / "fig.png")


def test_save_figure_failure_leaves_no_partial_file(tmp_path, monkeypatch):
  target = tmp_path / "out" / "fig.png"
  plots.save_figure(_small_figure(), target)
  before = target.read_bytes()

  def broken_savefig(self, file, **kwargs):
    file.write(b"\x89PNG partial")
    raise OSError("disk full")

  monkeypatch.setattr(Figure, "savefig", broken_savefig)
  with pytest.raises(OSError, match="disk full"):
    plots.save_figure(_small_figure(), target)
  with pytest.raises(OSError, match="disk full"):
    plots.save_figure(_small_figure(), tmp_path / "out" / "new.png")
  assert target.read_bytes() == before  # the old figure is untouched
  assert os.listdir(target.parent) == ["fig.png"]  # no partial new file, no temp file


def test_plots_install_with_matplotlib_alone(tmp_path):
  # The plots extra is matplotlib: figures and the results page work without etils
  # (io.files imports it only for a URL).
  code = (
    "import sys; sys.modules['etils'] = None\n"
    "import numpy as np\n"
    "from top1_jax import plots\n"
    "u = np.linspace(0.1, 1, 200); correct = np.arange(200) % 3 > 0\n"
    f"plots.save_figure(plots.reliability_diagram(u, correct), {str(tmp_path / 'r.png')!r})\n"
    f"plots.write_results_page({str(tmp_path)!r}, '# t')\n"
  )
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert (tmp_path / "r.png").is_file() and (tmp_path / "index.html").is_file()


def test_figures_written_by_workers_equal_figures_written_here(pair10, ablation_results, tmp_path):
  from top1_jax.plots import figures, shift_figures

  u, correct = _scores(500)
  shifted = [{"method": "deterministic", "estimator": "raw", "score": "pmax", "shift": "rotate",
              "severity": a, "accuracy": 1 - a / 360, "ece": a / 900, "brier": a / 600,
              "dropout_rate": 0.0, "topk": 1, "n_bins": 15} for a in range(0, 181, 15)]  # fmt: skip
  makers = {  # one of each kind: bars and bounds, error bars, counts, a tick formatter
    "bins.png": lambda: plots.bin_figure(*pair10, title="bins"),
    "ablation.png": lambda: plots.ablation_figure(ablation_results),
    "reliability.png": lambda: plots.reliability_diagram(u, correct),
    "rotate.png": lambda: shift_figures.shift_curves(shifted, {"Vanilla": {}}, "rotate"),
  }
  for name, make in makers.items():
    plots.save_figure(make(), tmp_path / "here" / name)
  with figures.rendering(workers=2):
    for name, make in makers.items():
      plots.save_figure(make(), tmp_path / "workers" / name)
  for name in makers:
    assert (tmp_path / "workers" / name).read_bytes() == (tmp_path / "here" / name).read_bytes()


def test_a_figure_a_worker_cannot_write_is_one_error_and_the_others_are_written(tmp_path):
  from top1_jax.plots import figures

  (tmp_path / "taken").write_text("a file where a folder is asked for")
  with pytest.raises(RuntimeError, match=r"^figure not written: .*taken/fig\.png: \w+Error"):
    with figures.rendering(workers=2):
      plots.save_figure(_small_figure(), tmp_path / "taken" / "fig.png")
      plots.save_figure(_small_figure(), tmp_path / "ok.png")
  assert (tmp_path / "ok.png").read_bytes().startswith(b"\x89PNG")
  assert sorted(os.listdir(tmp_path)) == ["ok.png", "taken"]  # no temp file left


def test_a_figure_worker_imports_matplotlib_not_jax():
  code = "import sys; from top1_jax.plots import figures; print('jax' in sys.modules)"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert result.stdout.strip() == "False", result.stderr[-2000:]
