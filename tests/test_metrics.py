"""Metrics: the paper's worked examples, a plain loop, and exact decompositions."""

import jax.numpy as jnp
import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from top1_jax.core import binning, metrics
from top1_jax.evaluation import crossval


def _expand(prob, weight, num=48000):
  """Examples realising a histogram exactly: bin i has weight_i * num examples."""
  score, correct = [], []
  for p, w in zip(prob, weight, strict=True):
    m = int(round(num * w))
    h = int(round(m * p))
    score += [p] * m
    correct += [True] * h + [False] * (m - h)
  return np.array(score, np.float32), np.array(correct)


def test_coin_example_eor_is_8():
  assert metrics.eor([1 / 2, 1 / 2, 15 / 16, 1 / 16], [1, 1, 1, 1], 0.5) == pytest.approx(8)


def test_coin_example_auroc_depends_on_order():
  score, correct = _expand([1 / 2, 1 / 2, 15 / 16, 1 / 16], [0.25] * 4)
  assert metrics.auroc(score, correct) == pytest.approx(0.828, abs=1e-3)
  assert metrics.auroc(-score, correct) == pytest.approx(0.172, abs=1e-3)


def test_same_auroc_different_eor_example():
  p, q = [0.15, 0.4, 0.8], [0.4, 0.5, 0.99]
  assert metrics.auroc(*_expand(p, [1 / 3] * 3)) == pytest.approx(0.79, abs=0.005)
  assert metrics.auroc(*_expand(q, [1 / 3] * 3)) == pytest.approx(0.78, abs=0.005)
  assert metrics.eor(p, [1, 1, 1], 0.45) == pytest.approx(3.6, abs=0.05)
  assert metrics.eor(q, [1, 1, 1], 0.63) == pytest.approx(21, abs=0.5)


def test_per_example_metrics_match_loop():
  rng = np.random.default_rng(0)
  p = rng.random(500).astype(np.float32)
  correct = rng.random(500) < p
  assert metrics.brier(p, correct) == pytest.approx(reference.brier(p, correct), rel=1e-5)
  assert metrics.nll(p, correct) == pytest.approx(reference.nll(p, correct), rel=1e-5)
  assert metrics.auroc(p, correct) == pytest.approx(reference.auroc(p, correct), rel=1e-6)


def test_auroc_counts_ties_one_half_against_pairwise_loop():
  rng = np.random.default_rng(1)
  score = rng.integers(0, 4, 300).astype(np.float32)
  correct = rng.random(300) < 0.3 + 0.1 * score
  pos, neg = score[correct], score[~correct]
  pairwise = np.mean((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None]))
  assert metrics.auroc(score, correct) == pytest.approx(pairwise, rel=1e-6)


def test_nll_of_saturated_wrong_prediction_is_finite():
  assert np.isfinite(metrics.nll([1.0, 0.0], [False, True]))


def _binned(seed, num=4000, n_bins=10, ties=False):
  rng = np.random.default_rng(seed)
  u = rng.random(num).astype(np.float32)
  if ties:
    u = np.round(u * 5) / 5
  correct = rng.random(num) < 0.2 + 0.75 * u
  half = num // 2
  bins = binning.fit(u[:half], correct[:half], n_bins)
  test = binning.refit(bins, u[half:], correct[half:])
  return bins, test, u[half:], correct[half:]


# Few distinct bin counts: each one compiles ``fit`` once.
@settings(max_examples=30)
@given(st.integers(0, 10_000), st.sampled_from([1, 3, 10, 37]), st.booleans())
def test_decompositions_add_up_to_the_scores(seed, n_bins, ties):
  bins, test, u, correct = _binned(seed, n_bins=n_bins, ties=ties)
  p = binning.predict(bins, u)
  b = metrics.brier_decomposition(bins, test)
  n = metrics.nll_decomposition(bins, test)
  assert float(b.total) == pytest.approx(metrics.brier(p, correct), abs=2e-6)
  assert float(n.total) == pytest.approx(metrics.nll(p, correct), abs=2e-5)
  for d in (b, n):
    assert float(d.uncertainty - d.resolution + d.calibration) == pytest.approx(float(d.total))
    assert float(d.resolution) >= -1e-7 and float(d.calibration) >= -1e-7
  assert metrics.binned_ece(bins, test) >= 0


def test_binned_metrics_match_loop():
  bins, test, u, correct = _binned(7, n_bins=12)
  edges = np.asarray(bins.edges)[np.isfinite(bins.edges)]
  expected = reference.binned_scores(
    np.asarray(bins.prob, np.float64), float(bins.prior), reference.assign(edges, u), correct
  )
  b = metrics.brier_decomposition(bins, test)
  n = metrics.nll_decomposition(bins, test)
  got = {
    "ece": metrics.binned_ece(bins, test),
    "eor": metrics.eor(bins.prob, test.counts, bins.prior),
    "brier": b.total,
    "brier_resolution": b.resolution,
    "brier_calibration": b.calibration,
    "nll": n.total,
    "nll_resolution": n.resolution,
    "nll_calibration": n.calibration,
    "auroc": metrics.auroc(binning.predict(bins, u), correct),
  }
  for name, value in got.items():
    assert float(value) == pytest.approx(expected[name], rel=1e-4, abs=1e-6), name


def test_nll_survives_accuracies_that_round_above_one():
  # On a GPU, float32 hits / counts with hits == counts came out a hair above 1 and the
  # binary entropy of the bin turned every NLL into nan. Feed such values directly.
  above_one = np.float32(1) + np.finfo(np.float32).eps
  assert float(metrics._binary_entropy(jnp.float32(above_one))) == 0.0
  assert float(metrics._binary_entropy(jnp.float32(-1e-8))) == 0.0
  prob = jnp.asarray([0.5, 0.9, 0.99], jnp.float32)
  counts = jnp.asarray([250.0, 250.0, 250.0])
  hits = jnp.asarray([125.0, 250.0, 250.0]) * above_one  # "all correct" bins, rounded up
  nll = metrics.nll_from_counts(prob, counts, hits)
  exact = metrics.nll_from_counts(prob, counts, jnp.asarray([125.0, 250.0, 250.0]))
  for got, want in zip(nll, exact, strict=True):
    assert np.isfinite(float(got))
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)


SCORES_AND_TERMS = ("brier", "brier_uncertainty", "nll", "nll_uncertainty")


@pytest.mark.parametrize("scheme", ["halves", "kfold"])
def test_an_all_correct_split_never_scores_below_zero(scheme):
  # The weighted sum of the bins' accuracies of 1 rounded to 1 + 2^-23, so a(1 - a)
  # and the Brier went negative (-1.2e-7) and the binary entropy was -0.
  u = np.random.default_rng(0).normal(size=200).astype(np.float32)
  cv = crossval.cross_validate(u, np.ones(200, bool), (1, 3, 7, 10, 20), scheme=scheme)
  for name in SCORES_AND_TERMS:
    values = np.asarray(cv.per_fold[name])
    assert np.all(values >= 0) and not np.any(np.signbit(values)), (name, values.min())


def test_a_total_that_rounds_below_zero_stops_at_zero():
  # Bins of all-correct and all-wrong examples predicted exactly: resolution equals
  # uncertainty, and their difference is rounding of either sign.
  rng = np.random.default_rng(1)
  counts = rng.integers(1, 1000, size=(500, 7)).astype(np.float32)
  hits = counts * (rng.random((500, 7)) < 0.5)
  prob = hits / counts
  for decomposition in (metrics.brier_from_counts, metrics.nll_from_counts):
    total = np.asarray(decomposition(prob, counts, hits).total)
    assert np.all(total >= 0) and not np.any(np.signbit(total)), decomposition
    np.testing.assert_allclose(total, 0, atol=2e-6)


def test_eor_is_at_least_one_and_one_for_a_constant_predictor():
  assert metrics.eor([0.7, 0.7], [3, 1], 0.7) == pytest.approx(1.0)
  assert metrics.eor([0.2, 0.9], [1, 1], 0.6) > 1


def test_eor_ignores_zero_weight_bins():
  assert metrics.eor([0.5, 1.0], [1, 0], 0.5) == pytest.approx(1.0)


def test_binned_metrics_of_concrete_bins_are_one_program_each(compiles):
  # Run op by op, the binned metrics compiled a program per jnp operation (~10 for
  # an ECE): the figures of one evaluate compiled 36. 41 bins: a shape no other test
  # here compiles, so a metric's programs cannot have been compiled before.
  bins, test, _, _ = _binned(3, n_bins=41)
  weight = np.asarray(test.counts, np.float32)  # a device int array would be converted there
  compiles.clear()
  ece = metrics.binned_ece(bins, test)
  brier = metrics.brier_decomposition(bins, test)
  nll = metrics.nll_decomposition(bins, test)
  eor = metrics.eor(bins.prob, weight, 0.6)
  assert len(compiles) <= 4
  np.testing.assert_allclose(ece, metrics.ece_from_counts(bins.prob, test.counts, test.hits))
  np.testing.assert_allclose(
    brier.total, metrics.brier_from_counts(bins.prob, test.counts, test.hits).total
  )
  np.testing.assert_allclose(
    nll.total, metrics.nll_from_counts(bins.prob, test.counts, test.hits).total
  )
  assert float(eor) >= 1.0


def test_ece_of_perfectly_matching_bins_is_zero():
  bins, _, u, correct = _binned(3)
  # Refit on the calibration data itself: accuracy differs from prob only by the prior.
  assert metrics.binned_ece(bins, bins) < 1.0 / float(bins.counts.min())


def test_ece_of_arrays_is_the_equal_width_ece_of_a_plain_loop():
  rng = np.random.default_rng(4)
  # Predictions on the bin edges too: bins are right-closed, 0 in the first.
  confidence = np.concatenate([rng.random(300), np.arange(16) / 15]).astype(np.float32)
  correct = rng.random(confidence.shape[0]) < confidence
  for n_bins in (1, 10, 15):
    edges = (np.arange(1, n_bins) / n_bins).astype(np.float32)  # the benchmark's digitize
    index = np.digitize(confidence, edges, right=True)
    gaps = [
      abs(np.sum(correct[index == b]) - np.sum(confidence[index == b], dtype=np.float64))
      for b in range(n_bins)
    ]
    expected = sum(gaps) / confidence.shape[0]
    assert metrics.ece(confidence, correct, n_bins) == pytest.approx(expected, abs=1e-6)
  assert metrics.ece(confidence, correct) == metrics.ece(confidence, correct, n_bins=15)


def test_public_metrics_return_python_floats():
  bins, test, u, correct = _binned(3)
  p = np.asarray(binning.predict(bins, u), np.float32)
  values = [
    metrics.brier(p, correct),
    metrics.nll(p, correct),
    metrics.ece(p, correct),
    metrics.auroc(p, correct),
    metrics.smooth_ece(p, correct),
    metrics.aurc(p, correct),
    metrics.eor(bins.prob, np.asarray(test.counts, np.float32), 0.6),
    metrics.binned_ece(bins, test),
    *metrics.brier_decomposition(bins, test),
    *metrics.nll_decomposition(bins, test),
  ]
  assert all(type(value) is float for value in values), [type(v) for v in values]
  risk = metrics.selective_risk(p, correct)  # a curve: an array
  assert risk.shape == correct.shape


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: metrics.brier([0.5, 1.2], [1, 0]), r"p: probabilities must lie in \[0, 1\]"),
    (lambda: metrics.nll([0.5], [1, 0]), "length mismatch: p has 1, correct has 2"),
    (lambda: metrics.brier([np.nan], [1]), "p: 1 non-finite"),
    (lambda: metrics.auroc([0.1, 0.2], [1, 1]), "AUROC needs both correct and incorrect"),
    (lambda: metrics.eor([0.5, 1.0], [1, 1], 0.5), "strictly inside"),
    (lambda: metrics.eor([0.5, 0.6], [-1, 2], 0.5), "weight: expected non-negative"),
    (lambda: metrics.eor([0.5, 0.6], [1, 2], 1.0), "base_rate: expected a value strictly"),
    (lambda: metrics.eor([0.5], [1, 2], 0.5), "length mismatch"),
    (lambda: metrics.binned_ece(*_mismatched()), "test_bins: expected 5 bins"),
  ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def _mismatched():
  u, correct = np.linspace(0, 1, 20), np.arange(20) % 2 == 0
  return binning.fit(u, correct, 5), binning.fit(u, correct, 4)
