"""Figures of calibration under dataset shift: built from synthetic tidy rows, checked, saved."""

import numpy as np
import pytest
from matplotlib import image as mpl_image
from matplotlib.figure import Figure

from top1_jax.plots import figures
from top1_jax.plots import shift_figures as shift

ROTATIONS = tuple(range(0, 181, 15))
TRANSLATIONS = tuple(range(0, 15, 2))
CORRUPTIONS = ("gaussian_noise", "contrast", "pixelate")

METHODS = {  # label -> (filter, how fast it degrades)
  "Vanilla": ({"method": "deterministic", "estimator": "raw", "score": "pmax"}, 1.0),
  "Temp scaling": ({"method": "deterministic", "estimator": "temperature"}, 0.9),
  "Ensemble": ({"method": "ensemble", "estimator": "raw"}, 0.6),
  "Bins (pmax)": ({"method": "deterministic", "estimator": "bins", "score": "pmax"}, 0.8),
}
VARIANTS = {label: conditions for label, (conditions, _) in METHODS.items()}


def _row(conditions, name, severity, level, rng):
  """One tidy row: metrics that worsen with ``level`` in [0, 1]."""
  row = {"dropout_rate": 0.0, "score": "pmax", "topk": 1, "n_bins": 15}
  row |= {**conditions, "shift": name, "severity": severity}
  row["accuracy"] = 0.92 - 0.7 * level + 0.01 * rng.random()
  row["brier"] = 0.06 + 0.5 * level + 0.01 * rng.random()
  row["ece"] = 0.01 + 0.3 * level * rng.random()
  row["nll"] = 0.2 + 2 * level
  for metric in ("accuracy", "brier", "ece", "nll"):
    row[f"{metric}_std"] = 0.02 * rng.random()
  return row


def _rows(seed=0, oracle=False):
  rng = np.random.default_rng(seed)
  methods = dict(METHODS)
  if oracle:
    methods["Oracle"] = (
      {"method": "deterministic", "estimator": "bins", "score": "oracle_loss"},
      3,
    )
  rows = []
  for conditions, speed in methods.values():
    rows.append(_row(conditions, "clean", 0, 0.0, rng))
    rows += [_row(conditions, "rotate", a, speed * a / 180, rng) for a in ROTATIONS[1:]]
    rows += [_row(conditions, "translate", t, speed * t / 14, rng) for t in TRANSLATIONS[1:]]
    for name in CORRUPTIONS:
      rows += [_row(conditions, name, s, speed * s / 6 * rng.random(), rng) for s in range(1, 6)]
    rows.append(_row(conditions, "ood_digits", 0, 1.0, rng))
  # The estimators on other scores: a filter without "score" must then name one.
  rows.append(_row({**METHODS["Vanilla"][0], "score": "entropy"}, "rotate", 15, 0.2, rng))
  return rows


@pytest.fixture(scope="module")
def rows():
  return _rows()


def _check_png(path):
  pixels = mpl_image.imread(path)
  assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
  assert len(np.unique(pixels[..., :3].reshape(-1, 3), axis=0)) > 10  # not blank


def _legend_labels(fig):
  return [text.get_text() for text in fig.legends[0].get_texts()]


# --------------------------------------------------------------------------- shift_curves


def test_shift_curves_one_line_per_variant_clean_first(rows, tmp_path):
  fig = shift.shift_curves(rows, VARIANTS, "rotate")
  assert isinstance(fig, Figure)
  assert len(fig.axes) == 3
  for ax in fig.axes:
    assert len(ax.lines) == len(VARIANTS)
    assert len(ax.collections) == len(VARIANTS)  # the ± std bands
  assert _legend_labels(fig) == list(VARIANTS)
  accuracy = fig.axes[0]
  vanilla = accuracy.lines[0]
  assert list(vanilla.get_xdata()) == list(ROTATIONS)
  clean = next(r for r in rows if r["shift"] == "clean" and r["method"] == "deterministic")
  assert vanilla.get_ydata()[0] == pytest.approx(clean["accuracy"])
  assert accuracy.get_xlabel() == "rotation (degrees; bilinear, no reshape)"
  assert fig.axes[2].get_ylabel() == "ECE % (15 equal-mass calibration-split bins)"
  _check_png(figures.save_figure(fig, tmp_path / "rotate.png", dpi=72))


def test_shift_curves_translate_and_a_corruption(rows):
  fig = shift.shift_curves(rows, VARIANTS, "translate", metrics=("nll",))
  assert len(fig.axes) == 1
  assert list(fig.axes[0].lines[2].get_xdata()) == list(TRANSLATIONS)
  assert fig.axes[0].get_xlabel() == "translation (pixels, zero fill)"
  fig = shift.shift_curves(rows, VARIANTS, "contrast", metrics=("ece", "accuracy"))
  assert list(fig.axes[0].lines[0].get_xdata()) == [0, 1, 2, 3, 4, 5]
  assert "contrast" in fig.axes[0].get_xlabel()


def test_shift_curves_oracle_is_grey_and_never_sets_the_axis():
  rows = _rows(oracle=True)
  plain = shift.shift_curves(rows, VARIANTS, "rotate", metrics=("brier",))
  variants = {**VARIANTS, "Oracle": {"score": "oracle_loss"}}
  fig = shift.shift_curves(rows, variants, "rotate", metrics=("brier",))
  ax = fig.axes[0]
  assert len(ax.lines) == len(variants)
  assert ax.get_ylim() == plain.axes[0].get_ylim()
  oracle_top = max(r["brier"] for r in rows if r["score"] == "oracle_loss")
  assert oracle_top > ax.get_ylim()[1]  # drawn off scale, not rescaled to
  assert _legend_labels(fig)[-1] == "Oracle (needs labels)"
  note = next(t.get_text() for t in ax.texts)
  assert note.startswith("Oracle: off scale above at") and "180" in note


def test_shift_curves_a_missing_value_is_a_gap(rows):
  holed = [dict(r) for r in rows]
  hole = next(r for r in holed if r["shift"] == "rotate" and r["severity"] == 90)
  hole["ece"] = None
  fig = shift.shift_curves(holed, {"Vanilla": VARIANTS["Vanilla"]}, "rotate", metrics=("ece",))
  y = fig.axes[0].lines[0].get_ydata()
  assert np.isnan(y[ROTATIONS.index(90)]) and np.isfinite(y).sum() == len(ROTATIONS) - 1


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"rows": []}, "rows: expected a non-empty list"),
    ({"rows": [{"method": "ensemble"}]}, "a 'shift' and a numeric 'severity'"),
    ({"rows": [{"shift": "rotate", "severity": None}]}, "a 'shift' and a numeric 'severity'"),
    ({"rows": [{"shift": None, "severity": 0}]}, "a 'shift' and a numeric 'severity'"),
    ({"metrics": ("sharpness",)}, "metrics: expected names among"),
    ({"metrics": "ece"}, "metrics: expected a non-empty list"),
    ({"shift": "zoom"}, "shift: expected one of the rows' shifts"),
    ({"variants": {}}, "variants: expected a non-empty dict"),
    ({"variants": {"MC": {"method": "mc_dropout"}}}, "variants['MC']: {'method': 'mc_dropout'}"),
    ({"variants": {"X": {"colour": "red"}}}, "variants['X']: expected columns of the rows"),
    ({"variants": {"Vanilla": {"method": "deterministic"}}}, "they differ in ['estimator'"),
    ({"variants": {"Temp": {"estimator": "temperature", "shift": "clean"}}}, "no row of shift"),
  ],
)
def test_shift_curves_refuses_bad_input_in_one_line(rows, kwargs, message):
  arguments = {"rows": rows, "variants": VARIANTS, "shift": "rotate"} | kwargs
  with pytest.raises(ValueError, match=None) as error:
    shift.shift_curves(**arguments)
  assert message in str(error.value) and "\n" not in str(error.value)


def test_shift_curves_ambiguity_names_the_differing_column(rows):
  with pytest.raises(ValueError, match=r"got 2 at shift 'rotate' severity 15.*\['score'\]"):
    shift.shift_curves(rows, {"Vanilla": {"method": "deterministic", "estimator": "raw"}}, "rotate")


# --------------------------------------------------------------------------- corruption_boxes


def test_corruption_boxes_one_box_per_variant_and_intensity(rows, tmp_path):
  fig = shift.corruption_boxes(rows, VARIANTS)
  assert len(fig.axes) == 2
  for ax in fig.axes:
    assert len(ax.patches) == len(VARIANTS) * 6  # clean and intensities 1-5
    assert [t.get_text() for t in ax.get_xticklabels()] == ["clean", "1", "2", "3", "4", "5"]
  assert "over 3 corruptions" in fig._suptitle.get_text()
  _check_png(figures.save_figure(fig, tmp_path / "boxes.png", dpi=72))


def test_corruption_boxes_pool_every_corruption_at_an_intensity(rows):
  fig = shift.corruption_boxes(rows, {"Ensemble": VARIANTS["Ensemble"]}, metrics=("brier",))
  ax = fig.axes[0]
  # A box's median line spans its box; its height is the median over the corruptions.
  medians = [line for line in ax.lines if line.get_color() == "black"]
  assert len(medians) == 6
  ensemble = [r for r in rows if r["method"] == "ensemble" and r["shift"] in CORRUPTIONS]
  for severity in range(1, 6):
    expected = np.median([r["brier"] for r in ensemble if r["severity"] == severity])
    assert medians[severity].get_ydata()[0] == pytest.approx(expected)


def test_corruption_boxes_a_chosen_subset_and_the_oracle_as_reference():
  rows = _rows(oracle=True)
  fig = shift.corruption_boxes(
    rows,
    {**VARIANTS, "Oracle": {"score": "oracle_loss"}},
    metrics=("ece",),
    corruptions=["contrast"],
  )
  assert len(fig.axes[0].patches) == (len(VARIANTS) + 1) * 6
  assert "over 1 corruptions" in fig._suptitle.get_text()
  assert any(t.get_text().startswith("Oracle: off scale above") for t in fig.axes[0].texts)
  with pytest.raises(ValueError, match="corruptions: expected names among the rows'"):
    shift.corruption_boxes(rows, VARIANTS, corruptions=["rotate"])


def test_corruption_boxes_refuses_rows_without_corruptions(rows):
  geometric = [r for r in rows if r["shift"] in ("clean", "rotate")]
  with pytest.raises(ValueError, match="rows: expected rows of at least one corruption"):
    shift.corruption_boxes(geometric, VARIANTS)
  with pytest.raises(ValueError, match="metrics: expected names among"):
    shift.corruption_boxes(rows, VARIANTS, metrics=("brier", "calibration"))


# --------------------------------------------------------------------------- ood_histograms


def _p_correct(seed=0):
  rng = np.random.default_rng(seed)
  skews = {"Vanilla": 6.0, "Temp scaling": 3.0, "Bins (pmax)": 1.5}
  return {
    label: {
      "clean": rng.beta(8 * skew, 1, 800),
      "ood_digits": rng.beta(skew, 1.5, 300),
      "ood_uniform_noise": rng.beta(skew, 3, 300),
    }
    for label, skew in skews.items()
  }


def test_ood_histograms_one_panel_per_set_one_histogram_per_variant(tmp_path):
  p_correct = _p_correct()
  fig = shift.ood_histograms(p_correct, bins=25)
  assert len(fig.axes) == 3
  assert fig.axes[0].get_title().startswith("clean test set")
  for ax in fig.axes:
    assert len(ax.patches) == len(p_correct)
    assert ax.get_xlim() == (0, 1) and ax.get_xlabel() == "predicted P(correct)"
  noise = fig.axes[2]
  note = next(t.get_text() for t in noise.texts if t.get_text().startswith("mean P(correct)"))
  mean = p_correct["Temp scaling"]["ood_uniform_noise"].mean()
  assert f"Temp scaling {mean:.3f}" in note
  assert _legend_labels(fig) == [*p_correct, "mean (dotted)"]
  # Density: the outline's area is one.
  outline = noise.patches[0].get_xy()
  heights, widths = outline[1:-1:2, 1], np.diff(np.linspace(0, 1, 26))
  assert np.sum(heights * widths) == pytest.approx(1.0)
  _check_png(figures.save_figure(fig, tmp_path / "ood.png", dpi=72))


def test_ood_histograms_a_variant_may_lack_a_set():
  p_correct = _p_correct()
  del p_correct["Vanilla"]["ood_digits"]
  fig = shift.ood_histograms({"Vanilla": p_correct["Vanilla"], "T": p_correct["Temp scaling"]})
  panels = {ax.get_title().split(",")[0]: len(ax.patches) for ax in fig.axes}
  assert panels == {"clean test set (in distribution)": 2, "ood_digits": 1, "ood_uniform_noise": 2}


@pytest.mark.parametrize(
  "p_correct, bins, message",
  [
    ({}, 20, "p_correct: expected a non-empty dict"),
    ({"V": {}}, 20, "p_correct['V']: expected a non-empty dict"),
    ({"V": {"clean": np.zeros((3, 2))}}, 20, "p_correct['V']['clean']: expected a non-empty [N]"),
    ({"V": {"clean": []}}, 20, "p_correct['V']['clean']: expected a non-empty [N]"),
    (
      {"V": {"clean": [0.2, 1.3]}},
      20,
      "expected probabilities in [0, 1], got [0.2, 1.3], 0 NaN/inf",
    ),
    ({"V": {"clean": [0.2, np.nan]}}, 20, "1 NaN/inf"),
    ({"V": {"clean": [0.2, 0.5]}}, 0, "bins: expected a positive int, got 0"),
    ({"V": {"clean": [0.2, 0.5]}}, 2.5, "bins: expected a positive int, got 2.5"),
  ],
)
def test_ood_histograms_refuses_bad_input_in_one_line(p_correct, bins, message):
  with pytest.raises(ValueError) as error:
    shift.ood_histograms(p_correct, bins=bins)
  assert message in str(error.value) and "\n" not in str(error.value)


def test_shift_curves_ece_label_says_bins_after_ties(rows):
  tied = [r | {"num_effective_bins": 12.5 if r["shift"] == "rotate" else 15} for r in rows]
  fig = shift.shift_curves(tied, VARIANTS, "rotate", metrics=("ece",), ece_binning="equal-width")
  assert fig.axes[0].get_ylabel() == "ECE % (15 equal-width bins requested, 12.5 after ties)"
  mixed = [r | {"n_bins": 10} if r["method"] == "ensemble" else r for r in rows]
  fig = shift.shift_curves(mixed, VARIANTS, "rotate", metrics=("ece",))
  assert fig.axes[0].get_ylabel() == "ECE % (each variant's equal-mass calibration-split bins)"


def test_shift_curves_a_shift_of_its_own_severity_0_row_keeps_it(rows):
  own = [dict(r) for r in rows] + [
    r | {"shift": "rotate", "accuracy": 0.5} for r in rows if r["shift"] == "clean"
  ]
  fig = shift.shift_curves(own, VARIANTS, "rotate", metrics=("accuracy",))
  assert fig.axes[0].lines[0].get_ydata()[0] == pytest.approx(0.5)
