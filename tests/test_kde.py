"""Kernel estimate: beats 20 bins on a known truth, a direct-sum oracle, bands, inputs."""

import jax
import numpy as np
import pytest

from top1_jax.core import binning
from top1_jax.estimators import kde
from top1_jax.evaluation import crossval


def _truth(u):
  """A smooth, steep P(correct | U) for lognormal scores (a logistic in log U)."""
  return 1 / (1 + np.exp(4 * (np.log(u) + 0.5)))


def _draw(num, seed):
  rng = np.random.default_rng(seed)
  u = rng.lognormal(-1.0, 1.0, num).astype(np.float32)
  return u, rng.random(num) < _truth(u.astype(np.float64))


def _rms_to_truth(p, u):
  return float(np.sqrt(np.mean((np.asarray(p, np.float64) - _truth(u.astype(np.float64))) ** 2)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beats_twenty_bins_on_a_known_truth_and_fails_with_a_bad_bandwidth(seed):
  u, correct = _draw(20_000, seed)
  u_test, _ = _draw(100_000, 100 + seed)
  bins = _rms_to_truth(binning.predict(binning.fit(u, correct, 20), u_test), u_test)
  model = kde.fit(u, correct)
  assert _rms_to_truth(kde.predict(model, u_test), u_test) < 0.7 * bins
  # The same test fails for a window far too wide or far too narrow.
  for bad in (0.5, 1e-4):
    worse = _rms_to_truth(kde.predict(kde.fit(u, correct, bandwidth=bad), u_test), u_test)
    assert worse > bins, bad


def _direct(u, correct, bandwidth, at_u):
  """The estimate by the definition: Gaussian weights on mid-ranks, a plain double loop."""
  u = np.asarray(u, np.float64)
  num = u.shape[0]
  rank = np.array([(np.sum(u < v) + 0.5 * np.sum(u == v)) / num for v in u])
  prior = np.mean(correct)
  out = []
  for v in at_u:
    r = (np.sum(u < v) + 0.5 * np.sum(u == v)) / num
    weight = np.exp(-0.5 * ((r - rank) / bandwidth) ** 2)
    out.append((np.sum(weight * correct) + prior) / (np.sum(weight) + 1))
  return np.array(out)


@pytest.mark.parametrize("ties", [False, True])
def test_the_tabulated_estimate_matches_the_direct_sum(ties):
  u, correct = _draw(600, seed=3)
  if ties:
    u = (np.round(u * 8) / 8).astype(np.float32)
  model = kde.fit(u, correct, bandwidth=0.05)
  knots = np.unique(np.asarray(model.knots))
  expected = _direct(u, correct, 0.05, knots)
  # Points are moved to the centre of their 1/4096-wide cell of rank: error ~1e-4.
  np.testing.assert_allclose(kde.predict(model, knots), expected, rtol=0, atol=3e-4)


def test_the_leave_one_out_nll_matches_the_direct_sum():
  u, correct = _draw(400, seed=4)
  rank = (np.argsort(np.argsort(u)) + 0.5) / 400
  prior = correct.mean()
  for bandwidth in (0.02, 0.1):
    weight = np.exp(-0.5 * ((rank[:, None] - rank[None, :]) / bandwidth) ** 2)
    np.fill_diagonal(weight, 0.0)
    p = (weight @ correct + prior) / (weight.sum(1) + 1)
    expected = -np.mean(np.where(correct, np.log(p), np.log1p(-p)))
    got = kde.leave_one_out_nll(u, correct, [bandwidth])
    # Up to moving each point to its cell's centre (by under 1/8192 of rank).
    np.testing.assert_allclose(got, [expected], rtol=1e-3)


def test_fit_chooses_the_bandwidth_of_least_leave_one_out_nll():
  u, correct = _draw(5000, seed=5)
  curve = kde.leave_one_out_nll(u, correct)
  model = kde.fit(u, correct)
  assert float(model.bandwidth) == np.float32(kde.BANDWIDTHS[int(np.argmin(curve))])
  # Too narrow and too wide both lose: the minimum is inside the grid.
  assert 0 < np.argmin(curve) < len(kde.BANDWIDTHS) - 1


def test_predictions_lie_inside_0_1_and_are_flat_beyond_the_data():
  u, correct = _draw(3000, seed=6)
  model = kde.fit(u, correct)
  low, high = float(u.min()), float(u.max())
  p = np.asarray(kde.predict(model, np.array([low - 1, low, high, high + 10, 0.0, 1e6])))
  assert np.all((p > 0) & (p < 1))
  assert p[0] == p[1] == p[4] and p[2] == p[3] == p[5]


def test_ties_and_a_point_mass_at_zero():
  # A third of the scores exactly 0 (probability 1 in float32), almost all correct.
  rng = np.random.default_rng(7)
  u = np.where(rng.random(6000) < 1 / 3, 0.0, rng.exponential(1.0, 6000)).astype(np.float32)
  correct = rng.random(6000) < np.where(u == 0, 0.99, np.exp(-u))
  model = kde.fit(u, correct)
  p0 = float(kde.predict(model, np.zeros(1, np.float32))[0])
  assert 0.9 < p0 < 1
  assert np.all(np.isfinite(np.asarray(model.prob)))


@pytest.mark.parametrize("num", [1, 2, 5])
def test_tiny_splits(num):
  u, correct = _draw(num, seed=8)
  model = kde.fit(u, correct)
  p = np.asarray(kde.predict(model, u))
  assert p.shape == (num,) and np.all(np.isfinite(p))
  lower, upper = kde.predict_interval(model, u)
  assert np.all((lower <= p) & (p <= upper))


def test_models_of_different_sizes_share_a_padded_knot_table():
  for num in (50, 3000, 10_000):
    model = kde.fit(*_draw(num, seed=9))
    size = model.knots.shape[0]
    assert size & (size - 1) == 0 and size <= kde.NUM_CELLS
    assert np.all(np.diff(np.asarray(model.knots)) >= 0)


def test_the_band_covers_a_linear_truth_at_its_nominal_rate():
  # On uniform scores a linear truth has no smoothing bias away from the ends, so
  # the band's coverage is its nominal 1 - delta = 0.9 up to Monte Carlo error.
  at = np.array([0.3, 0.5, 0.7], np.float32)
  covered = []
  for seed in range(200):
    rng = np.random.default_rng(1000 + seed)
    u = rng.random(4000).astype(np.float32)
    model = kde.fit(u, rng.random(4000) < 0.9 - 0.6 * u, bandwidth=0.05)
    lower, upper = kde.predict_interval(model, at, delta=0.1)
    truth = 0.9 - 0.6 * at
    covered.append((np.asarray(lower) <= truth) & (truth <= np.asarray(upper)))
  rate = np.mean(covered)
  assert 0.85 <= rate <= 0.95, rate


def test_the_band_narrows_with_more_data():
  widths = []
  for num in (1000, 16_000):
    u, correct = _draw(num, seed=10)
    model = kde.fit(u, correct, bandwidth=0.05)
    lower, upper = kde.predict_interval(model, np.array([0.3], np.float32))
    widths.append(float(upper[0] - lower[0]))
  assert 3 < widths[0] / widths[1] < 5  # ~sqrt(16)


def test_predict_works_under_jit():
  u, correct = _draw(500, seed=11)
  model = kde.fit(u, correct)
  np.testing.assert_array_equal(jax.jit(kde.predict)(model, u), kde.predict(model, u))
  lower, _ = jax.jit(kde.predict_interval)(model, u)
  np.testing.assert_allclose(lower, kde.predict_interval(model, u)[0], rtol=1e-5)


def test_fit_under_jit_is_a_clear_error():
  u, correct = _draw(10, seed=12)
  with pytest.raises(ValueError, match="^u: kde.fit needs concrete arrays"):
    jax.jit(kde.fit)(u, correct)


@pytest.mark.parametrize(
  ("kwargs", "message"),
  [
    ({"u": np.array([0.1, np.nan]), "correct": [True, False]}, "^u: 1 non-finite"),
    ({"u": np.zeros(0), "correct": np.zeros(0, bool)}, "^u: expected at least one example"),
    ({"u": np.zeros(3), "correct": [True, False]}, "^length mismatch"),
    ({"u": np.zeros(2), "correct": [1, 0], "bandwidth": 0.0}, "^bandwidth: expected a positive"),
    ({"u": np.zeros(2), "correct": [1, 0], "bandwidth": np.nan}, "^bandwidth: expected a positive"),
    ({"u": np.zeros(2), "correct": [1, 0], "bandwidth": "wide"}, "^bandwidth: expected a positive"),
  ],
)
def test_bad_inputs_are_one_line_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    kde.fit(**kwargs)


def test_other_entry_points_check_their_arguments():
  model = kde.fit(np.array([0.0, 1.0]), np.array([True, False]))
  with pytest.raises(ValueError, match="^model: expected kde.KernelModel"):
    kde.predict(binning.fit(np.array([0.0, 1.0]), np.array([True, False]), 1), [0.5])
  with pytest.raises(ValueError, match="^delta: expected a probability in"):
    kde.predict_interval(model, [0.5], delta=1.0)
  with pytest.raises(ValueError, match="^bandwidths: expected one or more positive"):
    kde.leave_one_out_nll([0.0, 1.0], [True, False], [0.1, -0.1])


def test_cross_validation_with_the_kernel_estimate_is_no_worse_than_bins():
  u, correct = _draw(6000, seed=13)
  bins = crossval.cross_validate(u, correct, n_bins=(10, 20), n_folds=4)
  cv = crossval.cross_validate(u, correct, n_bins=(10, 20), n_folds=4, estimator="kde")
  assert cv.n_bins == bins.n_bins and set(cv.per_fold) == set(bins.per_fold)
  for name, value in cv.per_fold.items():
    assert value.shape == (2, 4) and np.all(np.isfinite(value)), name
  # Per-example scores do not depend on the bin count; on this smooth truth the
  # kernel estimate's Brier is within a small margin of the best bins' (or better).
  np.testing.assert_array_equal(cv.per_fold["brier"][0], cv.per_fold["brier"][1])
  assert cv.mean["brier"][0] <= bins.mean["brier"].min() + 1e-3
  # Accuracy and the bins' uncertainty terms are the same test data's.
  np.testing.assert_allclose(cv.per_fold["accuracy"], bins.per_fold["accuracy"], rtol=1e-6)
  np.testing.assert_allclose(
    cv.per_fold["brier_uncertainty"], bins.per_fold["brier_uncertainty"], rtol=1e-5
  )
  np.testing.assert_array_equal(cv.num_defined["auroc"], bins.num_defined["auroc"])


@pytest.mark.parametrize("delta", [1e-17, 1e-300, 5e-324])
def test_a_tiny_delta_widens_the_band_instead_of_raising(delta):
  # Below delta = 1e-16, 1 - delta / 2 rounds to 1: statistics.NormalDist's quantile of 1
  # had raised StatisticsError.
  u, correct = _draw(500, seed=14)
  model = kde.fit(u, correct, bandwidth=0.05)
  at = np.array([0.2, 0.5], np.float32)
  lower, upper = (np.asarray(x) for x in kde.predict_interval(model, at, delta))
  usual = np.asarray(kde.predict_interval(model, at, 0.05)[0])
  assert np.all((0 <= lower) & (lower < usual) & (upper <= 1))


def test_a_bandwidth_option_is_checked_as_fit_checks_it():
  # Calibrator(method="kde") options: "x" and -1 had loaded from a saved file.
  entry = kde.ESTIMATOR
  for bad in ("x", -1, 0.0, float("nan"), True):
    with pytest.raises(ValueError, match="^bandwidth: expected a positive number or None"):
      entry.check_options({"bandwidth": bad})
  assert entry.check_options({"bandwidth": 0.02}) == {"bandwidth": 0.02}
  assert entry.check_options({"bandwidth": None}) == {"bandwidth": None}
