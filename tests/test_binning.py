"""Quantile bins: against a plain loop, ties, prior, bounds, calibration guarantee."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

import reference

from top1_jax import binning


def _data(num, seed=0, ties=False):
  rng = np.random.default_rng(seed)
  u = rng.random(num).astype(np.float32)
  if ties:
    u = np.round(u * 7) / 7  # 8 distinct values
  correct = rng.random(num) < 1 - u
  return u, correct


@pytest.mark.parametrize(
  "num, n_bins, ties", [(1000, 10, False), (997, 13, False), (500, 20, True)]
)
def test_fit_matches_loop(num, n_bins, ties):
  u, correct = _data(num, ties=ties)
  bins = binning.fit(u, correct, n_bins)
  edges, counts, hits, prob, prior = reference.fit_bins(u, correct, n_bins)
  finite = np.asarray(bins.edges)[np.isfinite(bins.edges)]
  np.testing.assert_allclose(finite, edges, rtol=1e-6)
  np.testing.assert_array_equal(bins.counts, counts)
  np.testing.assert_array_equal(bins.hits, hits)
  np.testing.assert_allclose(bins.prob, prob, rtol=1e-5)
  np.testing.assert_allclose(bins.prior, prior, rtol=1e-6)
  assert int(bins.num_effective_bins) == int(np.sum(counts > 0))


def test_equal_count_without_ties():
  u, correct = _data(1000)
  bins = binning.fit(u, correct, 10)
  np.testing.assert_array_equal(bins.counts, 100)


def test_ties_merge_edges_instead_of_leaving_empty_bins():
  u = np.concatenate([np.zeros(600), np.linspace(0.1, 1, 400)]).astype(np.float32)
  correct = np.arange(1000) % 3 > 0
  bins = binning.fit(u, correct, 10)
  counts = np.asarray(bins.counts)
  # 600 equal scores cannot be split: one bin holds them, the rest stay equal-count.
  assert counts[0] == 600 and list(counts[1:5]) == [100] * 4
  assert int(bins.num_effective_bins) == 5
  # The unused slots are at the end, with +inf edges, and predict the prior.
  assert np.all(counts[5:] == 0) and np.all(np.isinf(bins.edges[4:]))
  np.testing.assert_allclose(bins.prob[5:], bins.prior)


def test_all_scores_equal_gives_one_bin_at_the_accuracy():
  correct = np.arange(100) % 4 > 0
  bins = binning.fit(np.ones(100), correct, 10)
  assert int(bins.num_effective_bins) == 1
  np.testing.assert_allclose(binning.predict(bins, [0.0, 1.0, 2.0]), (75 + 0.75) / 101)


def test_prior_is_one_pseudo_count_at_calibration_accuracy():
  u = np.arange(10, dtype=np.float32)
  correct = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0], bool)
  bins = binning.fit(u, correct, 2)
  np.testing.assert_allclose(bins.prob, [(5 + 0.5) / 6, (0 + 0.5) / 6])
  assert 0 < float(bins.prob.min()) and float(bins.prob.max()) < 1


def test_bins_are_right_closed_and_extend_beyond_the_range():
  u = np.arange(1, 11, dtype=np.float32)  # edges at 2, 4, 6, 8 for 5 bins
  bins = binning.fit(u, np.ones(10, bool), 5)
  np.testing.assert_allclose(bins.edges, [2, 4, 6, 8])
  index = np.asarray(binning.assign(bins.edges, np.array([-5, 2, 2.5, 4, 8, 8.5, 99.0])))
  np.testing.assert_array_equal(index, [0, 0, 1, 1, 3, 4, 4])


def test_predict_and_refit():
  u, correct = _data(2000, seed=1)
  bins = binning.fit(u[:1000], correct[:1000], 10)
  p = np.asarray(binning.predict(bins, u[1000:]))
  index = reference.assign(np.asarray(bins.edges)[np.isfinite(bins.edges)], u[1000:])
  np.testing.assert_allclose(p, np.asarray(bins.prob)[index])
  test = binning.refit(bins, u[1000:], correct[1000:])
  np.testing.assert_array_equal(test.edges, bins.edges)
  np.testing.assert_array_equal(test.counts, np.bincount(index, minlength=10))
  np.testing.assert_array_equal(test.hits, np.bincount(index, correct[1000:], minlength=10))
  np.testing.assert_allclose(test.prior, correct[1000:].mean(), rtol=1e-6)


def test_fit_works_under_jit():
  import jax

  u, correct = _data(100)
  jitted = jax.jit(binning.fit, static_argnames="n_bins")(u, correct, n_bins=5)
  np.testing.assert_array_equal(jitted.counts, binning.fit(u, correct, 5).counts)


def test_hoeffding_halfwidth():
  np.testing.assert_allclose(
    binning.hoeffding_halfwidth(2500, 0.005), np.sqrt(np.log(2 / 0.005) / 5000), rtol=1e-6
  )
  assert np.isinf(binning.hoeffding_halfwidth(0))


@given(st.integers(0, 400), st.integers(1, 400), st.sampled_from([0.01, 0.05, 0.2]))
def test_clopper_pearson_matches_scipy(hits, count, delta):
  hits = min(hits, count)
  lower, upper = binning.clopper_pearson(hits, count, delta)
  exp_lower = 0.0 if hits == 0 else stats.beta.ppf(delta / 2, hits, count - hits + 1)
  exp_upper = 1.0 if hits == count else stats.beta.ppf(1 - delta / 2, hits + 1, count - hits)
  np.testing.assert_allclose([float(lower), float(upper)], [exp_lower, exp_upper], atol=2e-5)


def test_confidence_bounds_cover_the_empirical_accuracy():
  u, correct = _data(3000, seed=2)
  bins = binning.fit(u, correct, 15)
  acc = np.asarray(bins.hits / bins.counts)
  for method in ("clopper_pearson", "hoeffding"):
    lower, upper = map(np.asarray, binning.confidence_bounds(bins, 0.05, method))
    assert np.all(lower <= acc + 1e-6) and np.all(acc <= upper + 1e-6)
  # Hoeffding is the looser of the two at these sizes.
  cp_width = np.subtract(*binning.confidence_bounds(bins, 0.05)[::-1])
  hf_width = np.subtract(*binning.confidence_bounds(bins, 0.05, "hoeffding")[::-1])
  assert np.all(hf_width >= cp_width)


@given(st.integers(0, 2**31 - 1))
def test_calibrated_score_is_recovered_within_hoeffding(seed):
  """P(correct | u) = 1 - u: every test bin's accuracy is within the Hoeffding bound."""
  rng = np.random.default_rng(seed)
  num, n_bins, delta = 20000, 10, 1e-4
  u = rng.random(num).astype(np.float32)
  correct = rng.random(num) < 1 - u
  bins = binning.fit(u[: num // 2], correct[: num // 2], n_bins)
  test = binning.refit(bins, u[num // 2 :], correct[num // 2 :])
  edges = np.concatenate([[0.0], np.asarray(bins.edges), [1.0]])
  true_p = 1 - (edges[:-1] + edges[1:]) / 2  # exact mean of 1 - u over a uniform bin
  width = np.asarray(binning.hoeffding_halfwidth(bins.counts, delta))
  width_test = np.asarray(binning.hoeffding_halfwidth(test.counts, delta))
  # Calibration-split estimate (with its prior) and test accuracy both near the truth.
  assert np.all(np.abs(np.asarray(bins.prob) - true_p) <= width + 1.0 / np.asarray(bins.counts))
  assert np.all(np.abs(np.asarray(test.accuracy) - true_p) <= width_test)


@pytest.mark.parametrize(
  "call, message",
  [
    (
      lambda: binning.fit(np.zeros(5), np.ones(5, bool), 6),
      "n_bins: expected at least 1, at most 5",
    ),
    (lambda: binning.fit(np.zeros(5), np.ones(5, bool), 0), "n_bins: expected at least 1"),
    (
      lambda: binning.fit(np.zeros(5), np.ones(4, bool), 2),
      "length mismatch: u has 5, correct has 4",
    ),
    (lambda: binning.fit(np.array([0, np.nan]), [1, 0], 1), "u: 1 non-finite"),
    (lambda: binning.fit(np.zeros(3), [0, 2, 1], 1), "correct: expected bool or 0/1 values, got 2"),
    (lambda: binning.fit(np.zeros((3, 2)), [0, 1, 1], 1), "u: expected a 1-D array"),
    (lambda: binning.fit(np.zeros(0), np.zeros(0, bool), 1), "u: expected at least one example"),
    (lambda: binning.hoeffding_halfwidth(10, 1.5), "delta: expected a probability"),
    (lambda: binning.clopper_pearson(5, 3), "hits: expected 0 <= hits <= count"),
    (lambda: binning.confidence_bounds(binning.fit([0.0, 1.0], [0, 1], 1), method="x"), "method"),
  ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()
