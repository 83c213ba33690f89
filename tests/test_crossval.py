"""Cross-validation: the one-sort vectorised path against a per-split loop."""

import json

import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from top1_jax.core import binning, metrics
from top1_jax.evaluation import crossval


def _data(num, seed=0, distinct=None):
  rng = np.random.default_rng(seed)
  u = rng.random(num).astype(np.float32)
  if distinct is not None:
    u = np.floor(u * distinct) / distinct
  correct = rng.random(num) < 0.3 + 0.65 * u
  return u, correct


def _compare(cv, expected):
  for name in crossval.METRICS:
    np.testing.assert_allclose(
      cv.per_fold[name], expected[name], rtol=2e-4, atol=2e-6, err_msg=name
    )


@pytest.mark.parametrize(
  "num, n_bins, n_folds, scheme, distinct",
  [
    (3000, (10, 20, 100), 10, "halves", None),
    (2001, (7, 30), 5, "kfold", None),
    (999, (3, 10), 3, "halves", None),  # odd: halves of 499 / 500, 3 splits
    (1500, (5, 25), 4, "kfold", 12),  # heavy ties: merged edges, empty bins
    (800, (10,), 6, "halves", 3),
  ],
)
def test_matches_per_split_loop(num, n_bins, n_folds, scheme, distinct):
  u, correct = _data(num, seed=num, distinct=distinct)
  cv = crossval.cross_validate(u, correct, n_bins, n_folds, seed=1, scheme=scheme)
  splits = crossval.make_splits(num, n_folds, seed=1, scheme=scheme)
  masks = [splits.test_mask(f) for f in range(n_folds)]
  _compare(cv, reference.cross_validate(u, correct, n_bins, masks))
  assert cv.n_bins == tuple(n_bins)
  for name in crossval.METRICS:
    assert cv.per_fold[name].shape == (len(n_bins), n_folds)
    np.testing.assert_allclose(cv.mean[name], cv.per_fold[name].mean(1), rtol=1e-6)
    np.testing.assert_allclose(cv.std[name], cv.per_fold[name].std(1, ddof=1), rtol=1e-5, atol=1e-9)


@settings(max_examples=25)
@given(
  st.integers(10, 400),
  st.integers(0, 2**16),
  st.sampled_from(["halves", "kfold"]),
  st.one_of(st.none(), st.integers(1, 6)),
)
def test_matches_loop_on_random_small_problems(num, seed, scheme, distinct):
  u, correct = _data(num, seed=seed, distinct=distinct)
  n_bins = (1, 2, 5)
  cv = crossval.cross_validate(u, correct, n_bins, 3, seed=seed, scheme=scheme)
  splits = crossval.make_splits(num, 3, seed=seed, scheme=scheme)
  expected = reference.cross_validate(u, correct, n_bins, [splits.test_mask(f) for f in range(3)])
  for name in crossval.METRICS:
    both_nan = np.isnan(cv.per_fold[name]) & np.isnan(expected[name])
    np.testing.assert_allclose(
      np.where(both_nan, 0, cv.per_fold[name]),
      np.where(both_nan, 0, expected[name]),
      rtol=2e-4,
      atol=2e-6,
      err_msg=name,
    )


def test_equals_fit_and_refit_on_each_split():
  u, correct = _data(4000, seed=5)
  cv = crossval.cross_validate(u, correct, (20,), 4)
  splits = crossval.make_splits(4000, 4)
  for f in range(4):
    test = splits.test_mask(f)
    bins = binning.fit(u[~test], correct[~test], 20)
    test_bins = binning.refit(bins, u[test], correct[test])
    assert cv.per_fold["ece"][0, f] == pytest.approx(metrics.binned_ece(bins, test_bins), rel=1e-4)
    assert cv.per_fold["brier"][0, f] == pytest.approx(
      float(metrics.brier(binning.predict(bins, u[test]), correct[test])), rel=1e-4
    )


def test_decompositions_add_up():
  u, correct = _data(5000, seed=6)
  cv = crossval.cross_validate(u, correct)
  for score in ("brier", "nll"):
    total = cv.per_fold[f"{score}_uncertainty"] - cv.per_fold[f"{score}_resolution"]
    total = total + cv.per_fold[f"{score}_calibration"]
    np.testing.assert_allclose(total, cv.per_fold[score], rtol=1e-5)


def test_calibrated_score_has_small_ece_and_informative_score_beats_noise():
  rng = np.random.default_rng(7)
  u = rng.random(20000).astype(np.float32)
  correct = rng.random(20000) < 1 - 0.8 * u
  informative = crossval.cross_validate(u, correct, (10,), 10)
  noise = crossval.cross_validate(rng.random(20000), correct, (10,), 10)
  assert informative.mean["ece"][0] < 0.02
  assert informative.mean["brier"][0] < noise.mean["brier"][0]
  assert informative.mean["eor"][0] > 2 > noise.mean["eor"][0]
  assert informative.mean["auroc"][0] > 0.7 and abs(noise.mean["auroc"][0] - 0.5) < 0.05


def test_splits_are_exact_halves_and_partitions():
  halves = crossval.make_splits(1001, 5, seed=3)
  sizes = [halves.test_mask(f).sum() for f in range(5)]
  assert set(sizes) <= {500, 501}
  np.testing.assert_array_equal(halves.test_mask(0), ~halves.test_mask(1))
  assert not np.array_equal(halves.test_mask(0), halves.test_mask(2))
  kfold = crossval.make_splits(1003, 10, scheme="kfold")
  counts = sum(kfold.test_mask(f).astype(int) for f in range(10))
  np.testing.assert_array_equal(counts, 1)
  assert {kfold.test_mask(f).sum() for f in range(10)} <= {100, 101}


def test_random_halves_are_uniform():
  # Each example lands in the test half about half the time, independently of index.
  hits = sum(crossval.make_splits(10, 2, seed=s).test_mask(0).astype(int) for s in range(4000))
  np.testing.assert_allclose(hits / 4000, 0.5, atol=0.04)


def test_same_seed_same_splits_and_explicit_splits():
  u, correct = _data(600, seed=8)
  a = crossval.cross_validate(u, correct, (5,), 4, seed=11)
  b = crossval.cross_validate(u, correct, (5,), splits=crossval.make_splits(600, 4, seed=11))
  np.testing.assert_array_equal(a.per_fold["brier"], b.per_fold["brier"])
  c = crossval.cross_validate(u, correct, (5,), 4, seed=12)
  assert not np.array_equal(a.per_fold["brier"], c.per_fold["brier"])


def test_rows():
  u, correct = _data(600, seed=9)
  rows = crossval.cross_validate(u, correct, (5, 10), 4).rows()
  assert [r["n_bins"] for r in rows] == [5, 10]
  assert {"brier", "brier_std", "eor", "eor_std", "auroc", "num_effective_bins"} <= set(rows[0])


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"n_bins": (10, 0)}, "n_bins: expected at least 1"),
    ({"n_bins": (400,)}, "n_bins: expected at least 1, at most 300, got 400"),
    ({"n_bins": ()}, "n_bins: expected at least one"),
    ({"n_folds": 1}, "n_folds: expected at least 2"),
    ({"scheme": "loo"}, "scheme: expected one of"),
    ({"splits": crossval.make_splits(10, 2)}, "splits: made for 10 examples, u has 600"),
    ({"splits": np.zeros((2, 600), bool)}, "splits: expected crossval.Splits from make_splits"),
  ],
)
def test_bad_input(kwargs, message):
  u, correct = _data(600)
  with pytest.raises(ValueError, match=message):
    crossval.cross_validate(u, correct, **kwargs)


def test_bad_arrays():
  with pytest.raises(ValueError, match="u: 1 non-finite"):
    crossval.cross_validate(np.array([0.1, np.nan, 0.3, 0.4]), [1, 0, 1, 0], 1, 2)
  with pytest.raises(ValueError, match="length mismatch"):
    crossval.cross_validate(np.zeros(4), [1, 0, 1], 1, 2)


@pytest.mark.parametrize(
  "correct, undefined",
  [
    (np.arange(200) > 0, {"auroc"}),  # one wrong example: most test halves are all correct
    (np.ones(200, bool), {"auroc", "eor"}),  # every split: one class, calibration accuracy 1
    (np.zeros(200, bool), {"auroc", "eor"}),  # calibration accuracy 0
  ],
)
def test_undefined_metrics_are_reported_not_nan(correct, undefined):
  u = np.random.default_rng(0).random(200)
  cv = crossval.cross_validate(u, correct, (5, 20), n_folds=10)
  for row in cv.rows():
    for name, value in row.items():
      assert value is None or np.isfinite(value), (name, value)
    for name in crossval.UNDEFINABLE:
      count = row[f"{name}_num_splits"]
      assert 0 <= count <= 10
      assert (row[name] is None) == (count == 0)
  for name in undefined:
    assert cv.num_defined[name].min() < 10
  json.dumps(cv.rows(), allow_nan=False)
  json.dumps(cv.per_fold_lists(), allow_nan=False)


def test_means_and_stds_use_the_defined_splits():
  per_fold = {"auroc": np.array([[0.5, np.nan, 0.7, np.nan]]), "brier": np.array([[1.0, 2, 3, 4]])}
  cv = crossval.CrossValidation.from_per_fold((5,), per_fold)
  np.testing.assert_allclose(cv.mean["auroc"], [0.6])
  np.testing.assert_allclose(cv.std["auroc"], [np.std([0.5, 0.7], ddof=1)])
  np.testing.assert_array_equal(cv.num_defined["auroc"], [2])
  np.testing.assert_allclose(cv.std["brier"], [np.std([1, 2, 3, 4], ddof=1)])
  none = crossval.CrossValidation.from_per_fold((5,), {"auroc": np.array([[np.nan, np.nan]])})
  assert none.num_defined["auroc"][0] == 0 and np.isnan(none.mean["auroc"][0])
  lists = crossval.CrossValidation.from_per_fold((5,), per_fold).per_fold_lists()
  assert lists["auroc"] == [[0.5, None, 0.7, None]]


def test_isotonic_direction_follows_the_score():
  rng = np.random.default_rng(3)
  confidence = rng.random(2000)
  correct = rng.random(2000) < confidence
  up = crossval.cross_validate(confidence, correct, (10,), 4, estimator="isotonic", increasing=True)
  flipped = crossval.cross_validate(-confidence, correct, (10,), 4, estimator="isotonic")
  np.testing.assert_allclose(up.per_fold["brier"], flipped.per_fold["brier"], rtol=1e-5)
  wrong_way = crossval.cross_validate(confidence, correct, (10,), 4, estimator="isotonic")
  assert up.mean["brier"][0] < wrong_way.mean["brier"][0] - 0.05
