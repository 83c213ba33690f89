"""Isotonic estimate: scikit-learn's IsotonicRegression as the oracle, the prior, inputs.

scikit-learn (a test dependency only) pools scores closer than
``np.finfo(dtype).resolution``: 1e-15 for float64, but 1e-6 for float32 input. The
library pools exactly equal scores, so the oracle is always given float64 copies of
float32 scores (distinct float32 values above 1e-8 stay distinct there).
"""

from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.isotonic import IsotonicRegression

from top1_jax.core import binning, metrics
from top1_jax.estimators import isotonic
from top1_jax.evaluation import crossval


def _data(num, seed=0, ties=False, increasing=False):
  rng = np.random.default_rng(seed)
  u = rng.random(num).astype(np.float32)
  if ties:
    u = (np.round(u * 40) / 40).astype(np.float32)  # 41 distinct values
  truth = 0.2 + 0.7 * u if increasing else 0.95 - 0.7 * u
  return u, rng.random(num) < truth


def _sklearn(u, correct, increasing):
  model = IsotonicRegression(increasing=increasing, out_of_bounds="clip")
  return model.fit(np.asarray(u, np.float64), np.asarray(correct, np.float64))


def _queries(u, seed=1):
  """The calibration scores, new ones inside the range, and some beyond it."""
  rng = np.random.default_rng(seed)
  low, high = float(np.min(u)), float(np.max(u))
  inside = rng.uniform(low, high, 500)
  beyond = np.array([low - 1.0, low - 1e-3, high + 1e-3, high + 5.0])
  return np.concatenate([u, inside, beyond]).astype(np.float32)


@pytest.mark.parametrize("increasing", [False, True])
@pytest.mark.parametrize(
  ("num", "ties", "seed"), [(1000, False, 0), (5000, True, 1), (50, True, 2)]
)
def test_matches_sklearn_without_the_prior(num, ties, seed, increasing):
  u, correct = _data(num, seed, ties, increasing)
  model = isotonic.fit(u, correct, increasing=increasing, prior=False)
  oracle = _sklearn(u, correct, increasing)
  queries = _queries(u)
  got = np.asarray(isotonic.predict(model, queries), np.float64)
  np.testing.assert_allclose(got, oracle.predict(queries.astype(np.float64)), rtol=0, atol=1e-6)
  # The fitted values at the calibration points too (sklearn's fit_transform).
  np.testing.assert_allclose(got[:num], oracle.transform(u.astype(np.float64)), rtol=0, atol=1e-6)


@given(
  levels=st.lists(st.integers(0, 6), min_size=1, max_size=60),
  outcomes=st.lists(st.booleans(), min_size=60, max_size=60),
  increasing=st.booleans(),
)
@pytest.mark.slow
def test_matches_sklearn_on_small_tied_data(levels, outcomes, increasing):
  u = np.asarray(levels, np.float32) / 4
  correct = np.asarray(outcomes[: len(levels)])
  model = isotonic.fit(u, correct, increasing=increasing, prior=False)
  queries = _queries(u)
  expected = _sklearn(u, correct, increasing).predict(queries.astype(np.float64))
  np.testing.assert_allclose(isotonic.predict(model, queries), expected, rtol=0, atol=1e-6)


def test_matches_sklearn_where_the_hull_peels_one_corner_per_pass():
  # Tie groups whose accuracies are every fraction h/n (n <= 20) in decreasing order
  # make a concave chain of 129 corners; a final group of 1000 correct examples at
  # the highest U then pools them back one corner per pass: the slowest case for the
  # vectorised passes, which must still find the same fit.
  fractions = sorted({Fraction(h, n) for n in range(1, 21) for h in range(n + 1)}, reverse=True)
  sizes = [f.denominator for f in fractions] + [1000]
  hits = [f.numerator for f in fractions] + [1000]
  u = np.repeat(np.arange(len(sizes), dtype=np.float32), sizes)
  correct = np.concatenate([np.arange(n) < h for n, h in zip(sizes, hits, strict=True)])
  model = isotonic.fit(u, correct, prior=False)
  assert model.num_blocks < len(fractions) // 2
  expected = _sklearn(u, correct, False).predict(u.astype(np.float64))
  np.testing.assert_allclose(isotonic.predict(model, u), expected, rtol=0, atol=1e-6)


def _assert_monotone(p, increasing=False):
  steps = np.diff(np.asarray(p, np.float64))
  assert np.all(steps >= 0) if increasing else np.all(steps <= 0)


@pytest.mark.parametrize("increasing", [False, True])
def test_the_prior_gives_monotone_probabilities_strictly_inside_0_1(increasing):
  u, correct = _data(3000, seed=3, increasing=increasing)
  model = isotonic.fit(u, correct, increasing=increasing)
  p = np.asarray(isotonic.predict(model, np.sort(_queries(u))))
  _assert_monotone(p, increasing)
  assert np.all((p > 0) & (p < 1))
  assert int(model.counts.sum()) == 3000 and int(model.hits.sum()) == int(correct.sum())
  # Each block predicts the bins' rule (hits + p_A) / (count + 1) on its own counts.
  prior = np.float32(correct.sum()) / np.float32(3000)
  assert np.float32(model.prior) == prior
  block = binning.calibrated_prob(np.asarray(model.hits), np.asarray(model.counts), float(prior))
  np.testing.assert_allclose(np.unique(model.prob), np.unique(block.astype(np.float32)), rtol=1e-6)


def test_blocks_put_out_of_order_by_the_prior_are_pooled_again():
  # One correct example at the lowest U is a block of accuracy 1 above a large block
  # of accuracy 0.99; the prior pulls the singleton to (1 + p_A) / 2 < 0.99.
  big = np.concatenate([np.ones(990, bool), np.zeros(10, bool)])
  rest = np.zeros(1000, bool)
  correct = np.concatenate([[True], big, rest])
  u = np.concatenate([[0.0], np.full(1000, 1.0), np.full(1000, 2.0)]).astype(np.float32)
  plain = isotonic.fit(u, correct, prior=False)
  assert plain.counts.tolist() == [1, 1000, 1000]
  model = isotonic.fit(u, correct)
  assert model.counts.tolist() == [1001, 1000]
  assert model.hits.tolist() == [991, 0]
  _assert_monotone(isotonic.predict(model, np.array([0.0, 0.5, 1.0, 1.5, 2.0], np.float32)))


def test_blocks_in_order_after_the_prior_are_kept():
  # Three levels of 100 examples, 90, 60 and 30 correct: the prior keeps their order.
  u = np.repeat(np.arange(3, dtype=np.float32), 100)
  correct = np.concatenate([np.arange(100) < n for n in (90, 60, 30)])
  for prior in (False, True):
    model = isotonic.fit(u, correct, prior=prior)
    assert model.counts.tolist() == [100, 100, 100]
    assert model.hits.tolist() == [90, 60, 30]
  p_a = np.float32(0.6)
  expected = [(90 + p_a) / 101, (60 + p_a) / 101, (30 + p_a) / 101]
  np.testing.assert_allclose(isotonic.predict(model, [0.0, 1.0, 2.0]), expected, rtol=1e-6)


def test_a_split_of_one_class_predicts_its_accuracy():
  u = np.linspace(0, 1, 20, dtype=np.float32)
  for value in (True, False):
    model = isotonic.fit(u, np.full(20, value))
    assert model.num_blocks == 1
    np.testing.assert_array_equal(isotonic.predict(model, u), np.full(20, float(value), np.float32))


def test_a_single_example():
  model = isotonic.fit(np.array([0.5], np.float32), np.array([False]))
  np.testing.assert_array_equal(isotonic.predict(model, np.array([0.0, 1.0])), [0.0, 0.0])


def test_models_of_different_sizes_share_a_padded_knot_table():
  u, correct = _data(1000, seed=5)
  model = isotonic.fit(u, correct)
  size = model.knots.shape[0]
  assert size & (size - 1) == 0 and 2 * model.num_blocks <= size < 4 * model.num_blocks
  assert np.all(np.diff(np.asarray(model.knots)) >= 0)


def test_predict_works_under_jit():
  u, correct = _data(500, seed=6)
  model = isotonic.fit(u, correct)
  jitted = jax.jit(isotonic.predict)(model, u)
  np.testing.assert_array_equal(jitted, isotonic.predict(model, u))


def test_fit_under_jit_is_a_clear_error():
  u, correct = _data(10)
  with pytest.raises(ValueError, match="^u: isotonic.fit needs concrete arrays"):
    jax.jit(isotonic.fit)(u, correct)


@pytest.mark.parametrize(
  ("kwargs", "message"),
  [
    ({"u": np.array([0.1, np.nan]), "correct": [True, False]}, "^u: 1 non-finite"),
    ({"u": np.zeros((2, 2)), "correct": [True, False]}, "^u: expected a 1-D array"),
    ({"u": np.zeros(0), "correct": np.zeros(0, bool)}, "^u: expected at least one example"),
    ({"u": np.zeros(3), "correct": [True, False]}, "^length mismatch"),
    ({"u": np.zeros(2), "correct": [2, 0]}, "^correct: expected bool or 0/1"),
    ({"u": np.zeros(2), "correct": [1, 0], "increasing": "yes"}, "^increasing: expected a bool"),
    ({"u": np.zeros(2), "correct": [1, 0], "prior": 1}, "^prior: expected a bool"),
  ],
)
def test_bad_inputs_are_one_line_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    isotonic.fit(**kwargs)


def test_predict_checks_its_arguments():
  model = isotonic.fit(np.array([0.0, 1.0]), np.array([True, False]))
  with pytest.raises(ValueError, match="^model: expected isotonic.IsotonicModel"):
    isotonic.predict(binning.fit(np.array([0.0, 1.0]), np.array([True, False]), 1), [0.5])
  with pytest.raises(ValueError, match="^u: 1 non-finite"):
    isotonic.predict(model, [np.inf])


def test_cross_validation_scores_the_isotonic_estimate_split_by_split():
  u, correct = _data(3000, seed=7)
  cv = crossval.cross_validate(u, correct, n_bins=(5, 20), n_folds=4, estimator="isotonic")
  assert set(cv.per_fold) == set(crossval.METRICS)
  for name, value in cv.per_fold.items():
    assert value.shape == (2, 4) and np.all(np.isfinite(value)), name
  # Split 0 by hand: per-example Brier and NLL, and ECE on the calibration part's
  # 20 equal-count bins with the mean test prediction in each bin.
  splits = crossval.make_splits(3000, 4)
  test = splits.test_mask(0)
  model = isotonic.fit(u[~test], correct[~test])
  p = np.asarray(isotonic.predict(model, u[test]), np.float64)
  np.testing.assert_allclose(cv.per_fold["brier"][:, 0], np.mean((p - correct[test]) ** 2), 1e-5)
  np.testing.assert_allclose(cv.per_fold["nll"][:, 0], metrics.nll(p, correct[test]), 1e-5)
  bins = binning.fit(u[~test], correct[~test], 20)
  index = np.asarray(binning.assign(bins.edges, u[test]))
  count = np.bincount(index, minlength=20)
  accuracy = np.bincount(index, correct[test], 20) / count
  mean_p = np.bincount(index, p, 20) / count
  ece = np.sum(count / count.sum() * np.abs(accuracy - mean_p))
  np.testing.assert_allclose(cv.per_fold["ece"][1, 0], ece, rtol=1e-4)
  assert cv.per_fold["num_effective_bins"][1, 0] == 20


def test_cross_validation_rejects_an_unknown_estimator():
  u, correct = _data(100)
  with pytest.raises(ValueError, match="^estimator: expected one of"):
    crossval.cross_validate(u, correct, estimator="spline")


def test_options_are_checked_as_fit_checks_them():
  for name in ("increasing", "prior"):
    with pytest.raises(ValueError, match=f"^{name}: expected a bool, got 1"):
      isotonic.ESTIMATOR.check_options({name: 1})
  assert isotonic.ESTIMATOR.check_options({"increasing": True, "prior": False})
