"""bincount: the bin count chosen by nested cross-validation, and Calibrator(n_bins="cv")."""

import json

import numpy as np
import pytest
import synthetic

from top1_jax import Calibrator
from top1_jax.core import binning, metrics
from top1_jax.estimators import bin_count
from top1_jax.evaluation import crossval


def _smooth(num, seed):
  """U ~ Exp(1) with a smooth P(correct | U) = sigmoid(3 - 2.5 U)."""
  rng = np.random.default_rng(seed)
  u = rng.exponential(1.0, num)
  p = 1 / (1 + np.exp(-(3.0 - 2.5 * u)))
  return u.astype(np.float32), rng.random(num) < p


@pytest.mark.slow
def test_the_chosen_count_is_near_the_best_on_a_big_independent_test_set():
  u, correct = _smooth(20_000, seed=0)
  u_test, correct_test = _smooth(400_000, seed=99)
  chosen, cv = bin_count.choose_n_bins(u, correct)
  assert cv.n_bins == bin_count.DEFAULT_GRID and chosen in cv.n_bins
  nll = {
    n: float(metrics.nll(binning.predict(binning.fit(u, correct, n), u_test), correct_test))
    for n in cv.n_bins
  }
  excess = {n: value - min(nll.values()) for n, value in nll.items()}
  assert excess[chosen] < 2e-3, excess
  assert excess[chosen] < excess[5] / 5, excess  # far better than too few bins


def test_the_choice_is_the_lowest_mean_nll_of_the_nested_splits_ties_to_fewer_bins():
  u, correct = _smooth(3000, seed=1)
  chosen, cv = bin_count.choose_n_bins(u, correct, grid=(40, 10, 20, 10), n_folds=6, seed=3)
  splits = crossval.make_splits(3000, 6, 3, "halves")
  expected = crossval.cross_validate(u, correct, (10, 20, 40), splits=splits)
  assert cv.n_bins == (10, 20, 40)
  np.testing.assert_array_equal(cv.mean["nll"], expected.mean["nll"])
  assert chosen == cv.n_bins[int(np.argmin(expected.mean["nll"]))]
  # Constant scores: every count gives the same (one effective) bin, so the fewest wins.
  flat, _ = bin_count.choose_n_bins(np.zeros(200), correct[:200], grid=(50, 5, 20))
  assert flat == 5


def test_same_seed_same_choice():
  u, correct = _smooth(2000, seed=2)
  first = bin_count.choose_n_bins(u, correct, seed=7)
  second = bin_count.choose_n_bins(u, correct, seed=7)
  assert first[0] == second[0]
  np.testing.assert_array_equal(first[1].per_fold["nll"], second[1].per_fold["nll"])


@pytest.mark.parametrize("num", [10, 11, 25, 60])
def test_tiny_data_clips_the_default_grid_and_chooses_a_valid_count(num):
  u, correct = _smooth(num, seed=num)
  chosen, cv = bin_count.choose_n_bins(u, correct)
  assert cv.n_bins == tuple(sorted({min(n, num // 2) for n in bin_count.DEFAULT_GRID}))
  assert max(cv.n_bins) <= num // 2 and 1 <= chosen <= num // 2
  bins, n = bin_count.fit_cv(u, correct)
  assert n == chosen and bins.counts.shape == (n,) and int(np.sum(bins.counts)) == num


def test_fit_cv_is_binning_fit_with_the_chosen_count():
  u, correct = _smooth(5000, seed=4)
  bins, n = bin_count.fit_cv(u, correct, grid=(5, 10, 20), seed=1)
  assert n == bin_count.choose_n_bins(u, correct, grid=(5, 10, 20), seed=1)[0]
  expected = binning.fit(u, correct, n)
  for got, want in zip(bins, expected, strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"grid": ()}, "grid: expected at least one bin count, got none"),
    ({"grid": 10}, "grid: expected a sequence of bin counts, got 10"),
    ({"grid": "10"}, "grid: expected a sequence of bin counts"),
    ({"grid": (5, 2.5)}, "grid: expected integer bin counts, got 2.5"),
    ({"grid": (5, True)}, "grid: expected integer bin counts, got True"),
    ({"grid": (0, 5)}, r"grid: each bin count must lie in \[1, 50\]"),
    ({"grid": (5, 51)}, r"grid: each bin count must lie in \[1, 50\].*got 51"),
    ({"n_folds": 1}, "n_folds: expected at least 2"),
    ({"n_folds": 101}, "u: choosing n_bins by cross-validation needs at least n_folds=101"),
    ({"seed": -1}, "seed: expected at least 0"),
  ],
)
def test_bad_arguments_are_one_line_errors(kwargs, message):
  u, correct = _smooth(100, seed=5)
  with pytest.raises(ValueError, match=message) as info:
    bin_count.choose_n_bins(u, correct, **kwargs)
  assert "\n" not in str(info.value)


def test_bad_scores_are_one_line_errors():
  with pytest.raises(ValueError, match="length mismatch"):
    bin_count.choose_n_bins(np.zeros(20), np.zeros(19, bool))
  with pytest.raises(ValueError, match="u: 1 non-finite"):
    bin_count.choose_n_bins(np.r_[np.zeros(19), np.nan], np.zeros(20, bool))


def _logits(num, num_classes=10, seed=0):
  return synthetic.classifier_logits(num, num_classes, seed)


def test_calibrator_cv_fits_with_the_chosen_count_and_round_trips(tmp_path):
  logits, labels = _logits(4000)
  cal = Calibrator(n_bins="cv")
  assert cal.n_bins == "cv" and not hasattr(cal, "n_bins_") and "n_bins='cv'" in repr(cal)
  cal.fit(logits[:3000], labels[:3000])
  u = cal.scores_of(logits[:3000])
  correct = logits[:3000].argmax(1) == labels[:3000]
  bins, chosen = bin_count.fit_cv(u, correct)
  assert cal.n_bins_ == chosen and cal.bins_.counts.shape == (chosen,)
  expected = np.asarray(binning.predict(bins, cal.scores_of(logits)))
  np.testing.assert_array_equal(cal.predict_confidence(logits), expected)
  cal.save(tmp_path / "cal.json")
  state = json.loads((tmp_path / "cal.json").read_text())
  assert state["n_bins"] == chosen and state["n_bins_requested"] == "cv"
  loaded = Calibrator.load(tmp_path / "cal.json")
  assert loaded.n_bins == "cv" and loaded.n_bins_ == chosen
  np.testing.assert_array_equal(loaded.predict_confidence(logits), cal.predict_confidence(logits))
  # A file without the requested setting loads as a fixed count, as before.
  del state["n_bins_requested"]
  plain = Calibrator.from_dict(state)
  assert plain.n_bins == chosen and plain.n_bins_ == chosen


def test_calibrator_integer_n_bins_is_unchanged_and_reports_its_count():
  logits, labels = _logits(1000)
  cal = Calibrator(n_bins=15).fit(logits, labels)
  assert cal.n_bins == 15 and cal.n_bins_ == 15
  assert "n_bins_requested" not in cal.to_dict() and cal.to_dict()["n_bins"] == 15


def test_calibrator_cv_errors():
  logits, labels = _logits(5)
  with pytest.raises(ValueError, match="n_bins: expected an integer or \"cv\", got 'auto'"):
    Calibrator(n_bins="auto").fit(logits, labels)
  cal = Calibrator(n_bins="cv")
  with pytest.raises(ValueError, match="needs at least n_folds=10 examples, got 5"):
    cal.fit(logits, labels)
  assert not any(hasattr(cal, name) for name in ("state_", "bins_", "n_bins_", "num_classes_"))
