"""mislabeled.confident_errors against a plain-loop reference, in both score directions;
mislabeled.report's rows and searched bins."""

from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from top1_jax.evaluation import mislabeled


def _reference(u, correct, n_bins, top_bins, calibration=None):
  """The documented rule, one example and one bin at a time, probabilities as fractions."""
  u = [np.float32(x) for x in u]
  correct = [bool(c) for c in correct]
  if calibration is None:
    calibration = [True] * len(u)
  cal = [i for i in range(len(u)) if calibration[i]]
  ranked = sorted(u[i] for i in cal)
  size = len(ranked)
  edges = sorted({ranked[(i * size) // n_bins - 1] for i in range(1, n_bins)})

  def bin_of(x):
    return sum(1 for e in edges if e < x)

  counts = [0] * n_bins
  hits = [0] * n_bins
  for i in cal:
    counts[bin_of(u[i])] += 1
    hits[bin_of(u[i])] += correct[i]
  prior = Fraction(sum(correct[i] for i in cal), size)
  prob = [(h + prior) / (c + 1) for h, c in zip(hits, counts, strict=True)]
  filled = [b for b in range(n_bins) if counts[b] > 0]

  # Spearman's sign with average ranks for tied probabilities, in exact integers.
  num = len(filled)
  total = 0
  for pos, b in enumerate(filled):
    less = sum(1 for c in filled if prob[c] < prob[b])
    equal = sum(1 for c in filled if prob[c] == prob[b])
    twice_rank = 2 * less + equal + 1
    total += (2 * (pos + 1) - (num + 1)) * (twice_rank - (num + 1))
  direction = (total > 0) - (total < 0)

  selected = sorted(filled, key=lambda b: (-prob[b], -direction * b))[:top_bins]
  wrong = [i for i in range(len(u)) if bin_of(u[i]) in selected and not correct[i]]
  wrong.sort(key=lambda i: (-prob[bin_of(u[i])], -direction * float(u[i]), i))
  return wrong, [float(prob[bin_of(u[i])]) for i in wrong], selected, direction


def _planted(num=1000, seed=0):
  """Accuracy rising with the score to 90%; 3 errors planted among the 100 most confident."""
  rng = np.random.default_rng(seed)
  confidence = np.sort(rng.uniform(0.3, 1.0, num)).astype(np.float32)
  correct = rng.uniform(size=num) < np.linspace(0.3, 0.9, num)
  correct[num - 100 :] = True
  planted = np.array([num - 75, num - 1, num - 10])
  correct[planted] = False
  # Most confident first: the highest confidence first.
  return confidence, correct, np.sort(planted)[::-1]


def test_confidence_score_finds_the_planted_errors_most_confident_first():
  pmax, correct, planted = _planted()
  found = mislabeled.confident_errors(pmax, correct, n_bins=10)
  np.testing.assert_array_equal(found.index, planted)
  assert found.direction == 1
  assert found.selected_bins.tolist() == [9]
  assert found.index.dtype == np.int64 and found.bin.tolist() == [9, 9, 9]
  # 97 of the 100 examples right, one pseudo-count at the overall accuracy.
  expected = (97 + correct.mean()) / 101
  np.testing.assert_allclose(found.prob, expected, rtol=1e-6)


@pytest.mark.parametrize(
  "transform",
  [lambda p: -np.log(p), lambda p: 1.0 - p, lambda p: -p],
  ids=["neg_log", "one_minus", "negated"],
)
def test_uncertainty_scores_give_the_same_examples_in_the_same_order(transform):
  pmax, correct, planted = _planted()
  found = mislabeled.confident_errors(transform(pmax), correct, n_bins=10)
  np.testing.assert_array_equal(found.index, planted)
  assert found.direction == -1
  assert found.selected_bins.tolist() == [0]


def test_more_bins_follow_in_order_of_probability():
  pmax, correct, _ = _planted()
  for u in (pmax, -pmax):
    found = mislabeled.confident_errors(u, correct, n_bins=10, top_bins=3)
    expected, prob, selected, _ = _reference(u, correct, 10, 3)
    assert found.index.tolist() == expected
    assert found.selected_bins.tolist() == selected
    np.testing.assert_allclose(found.prob, prob, rtol=1e-6)
    assert np.all(np.diff(found.prob) <= 0)
    assert len(found.index) > 3  # the planted three, then the next bins' errors


def test_saturated_ties_form_one_bin_and_are_listed_by_index():
  # Softmax saturating at exactly 1.0: 60 tied examples, 3 of them wrong.
  rng = np.random.default_rng(1)
  pmax = np.sort(rng.uniform(0.2, 0.99, 200)).astype(np.float32)
  pmax[140:] = 1.0
  correct = rng.uniform(size=200) < pmax
  correct[140:] = True
  correct[[199, 141, 170]] = False
  for u in (pmax, 1.0 - pmax):
    found = mislabeled.confident_errors(u, correct, n_bins=10)
    assert found.index.tolist() == [141, 170, 199]
    (top,) = found.selected_bins
    assert int(found.bins.counts[top]) == 60 and int(found.bins.hits[top]) == 57
    assert int(found.bins.num_effective_bins) == 8  # edges 8 and 9 both 1.0: merged


def test_ties_in_score_within_a_bin_follow_the_index():
  u = np.array([0.1, 0.2, 0.3, 0.35, 0.9, 0.9, 0.8, 0.9], np.float32)
  correct = np.array([0, 0, 0, 0, 0, 1, 0, 0], bool)
  # Top bin (0.35, 0.9]: indices 4..7, wrong 4, 6, 7. Score 0.9 before 0.8; 4 before 7.
  for sign in (1.0, -1.0):
    found = mislabeled.confident_errors(sign * u, correct, n_bins=2)
    assert found.index.tolist() == [4, 7, 6]
    assert found.direction == sign


def test_calibration_mask_fits_on_part_and_searches_all():
  pmax, correct, planted = _planted()
  calibration = np.arange(len(pmax)) % 2 == 0
  found = mislabeled.confident_errors(pmax, correct, n_bins=5, calibration=calibration)
  expected, prob, selected, direction = _reference(pmax, correct, 5, 1, calibration)
  assert found.index.tolist() == expected and found.direction == direction == 1
  assert int(np.sum(found.bins.counts)) == 500
  assert set(planted) <= set(found.index.tolist())
  assert not set(found.index.tolist()) <= set(np.flatnonzero(calibration))


def test_a_flawless_top_bin_gives_no_examples():
  u = np.arange(40, dtype=np.float32)
  correct = np.arange(40) >= 10
  found = mislabeled.confident_errors(u, correct, n_bins=4)
  assert found.index.shape == (0,) and found.prob.shape == (0,)
  assert found.index.dtype == np.int64 and found.selected_bins.tolist() == [3]


def test_confidence_direction_on_ranks():
  assert mislabeled.confidence_direction([0.2, 0.5, 0.9]) == 1
  assert mislabeled.confidence_direction([0.9, 0.5, 0.2]) == -1
  assert mislabeled.confidence_direction([0.5, 0.5, 0.5]) == 0
  assert mislabeled.confidence_direction([0.7]) == 0
  # One outlier does not flip a clear trend (ranks, not values).
  assert mislabeled.confidence_direction([0.1, 0.2, 0.3, 0.4, 0.5, 0.0001]) == 1
  assert mislabeled.confidence_direction([0.3, 0.9, 0.3]) == 0
  # Tied probabilities share their average rank (with the lowest rank this would be -1).
  assert mislabeled.confidence_direction([0.1, 0.3, 0.2, 0.2, 0.2]) == 1


@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")
def test_confidence_direction_is_the_sign_of_scipy_spearman():
  rng = np.random.default_rng(3)
  for _ in range(200):
    prob = rng.integers(0, 4, rng.integers(2, 9)) / 4  # many ties
    rho = scipy.stats.spearmanr(np.arange(prob.size), prob).statistic
    expected = 0 if np.isnan(rho) or abs(rho) < 1e-12 else int(np.sign(rho))
    assert mislabeled.confidence_direction(prob) == expected, prob


# Few distinct shapes: every (calibration size, n_bins) pair compiles binning.fit once.
@settings(max_examples=40)
@given(
  data=st.data(),
  num=st.sampled_from([9, 40]),
  n_bins=st.sampled_from([1, 2, 3, 6]),
  top_bins=st.integers(1, 7),
  sign=st.sampled_from([1.0, -1.0]),
  tied=st.booleans(),
)
def test_matches_the_loop_reference(data, num, n_bins, top_bins, sign, tied):
  seed = data.draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  u = rng.integers(0, 5, num).astype(np.float32) if tied else rng.normal(size=num)
  u = (sign * u).astype(np.float32)
  correct = rng.uniform(size=num) < rng.uniform(0.2, 0.9)
  calibration = None
  if data.draw(st.booleans()):
    calibration = np.zeros(num, bool)
    calibration[rng.permutation(num)[: 2 * num // 3]] = True
  n_cal = num if calibration is None else int(calibration.sum())
  n_bins = min(n_bins, n_cal)
  top_bins = min(top_bins, n_bins)
  found = mislabeled.confident_errors(
    u, correct, n_bins=n_bins, top_bins=top_bins, calibration=calibration
  )
  expected, prob, selected, direction = _reference(u, correct, n_bins, top_bins, calibration)
  assert found.index.tolist() == expected
  np.testing.assert_allclose(found.prob, np.reshape(prob, -1), rtol=1e-6)
  assert found.selected_bins.tolist() == selected
  assert found.direction == direction
  assert not np.any(correct[found.index])


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"u": np.zeros((3, 2))}, "u: expected a 1-D"),
    ({"u": np.array([0.1, np.nan, 0.3, 0.4])}, "u: 1 non-finite"),
    ({"u": np.zeros(0), "correct": np.zeros(0, bool)}, "u: expected at least one"),
    ({"correct": np.ones(3, bool)}, "length mismatch"),
    ({"correct": np.array([0, 1, 2, 1])}, "correct: expected bool"),
    ({"n_bins": 0}, "n_bins: expected at least 1"),
    ({"n_bins": 5}, "n_bins: expected at least 1, at most 4"),
    ({"n_bins": 2.0}, "n_bins: expected an integer"),
    ({"top_bins": 3, "n_bins": 2}, "top_bins: expected at least 1, at most 2"),
    ({"calibration": np.zeros(4, bool)}, "calibration: expected at least one True"),
    ({"calibration": np.ones(3, bool)}, "length mismatch"),
    ({"calibration": np.array([True, False, True, False]), "n_bins": 3}, "at most 2"),
  ],
)
def test_bad_inputs_name_the_argument(kwargs, match):
  args = {"u": np.array([0.1, 0.2, 0.3, 0.4]), "correct": np.array([1, 0, 1, 1], bool)}
  args.update(kwargs)
  u = args.pop("u")
  correct = args.pop("correct")
  with pytest.raises(ValueError, match=match):
    mislabeled.confident_errors(u, correct, **args)


# ----------------------------------------------------------------------------
# report: the rows and searched bins a person reads

NAMES = tuple(f"class{c}" for c in range(10))


def _labelled(num=1000, seed=0):
  """_planted() plus Top-1 and given labels consistent with ``correct``."""
  pmax, correct, planted = _planted(num, seed)
  given = np.random.default_rng(seed + 1).integers(0, 10, num)
  predicted = np.where(correct, given, (given + 1) % 10)
  return pmax, correct, predicted, given, planted


def test_report_rows_follow_confident_errors_with_names():
  pmax, correct, predicted, given, planted = _labelled()
  found = mislabeled.report(pmax, correct, predicted, given, NAMES, n_bins=10, top_bins=2)
  errors = mislabeled.confident_errors(pmax, correct, n_bins=10, top_bins=2)
  assert [r["index"] for r in found.rows] == errors.index.tolist()
  assert [r["index"] for r in found.rows[:3]] == planted.tolist()
  assert [r["rank"] for r in found.rows] == list(range(1, len(found.rows) + 1))
  for row, prob in zip(found.rows, errors.prob, strict=True):
    assert tuple(row) == mislabeled.COLUMNS
    i = row["index"]
    assert (row["given_label"], row["predicted_label"]) == (given[i], predicted[i])
    assert (row["given_name"], row["predicted_name"]) == (NAMES[given[i]], NAMES[predicted[i]])
    assert row["bin_prob"] == f"{prob:.6f}"
    assert np.float32(row["score"]) == pmax[i]  # 9 digits round-trip a float32


def test_report_searched_bins_hold_counts_and_score_ranges():
  pmax, correct, predicted, given, _ = _labelled()
  for u in (pmax, -np.log(pmax)):
    found = mislabeled.report(u, correct, predicted, given, NAMES, n_bins=10, top_bins=3)
    bins, edges = found.errors.bins, np.asarray(found.errors.bins.edges)
    assert [b["bin"] for b in found.searched_bins] == found.errors.selected_bins.tolist()
    for b in found.searched_bins:
      in_bin = u[np.searchsorted(edges, u, side="left") == b["bin"]]  # right-closed bins
      assert (b["count"], b["correct"]) == (int(bins.counts[b["bin"]]), int(bins.hits[b["bin"]]))
      assert b["count"] == in_bin.size and b["prob"] == float(bins.prob[b["bin"]])
      assert (b["score_min"], b["score_max"]) == (float(in_bin.min()), float(in_bin.max()))
    summary = found.summary()
    assert summary["num_found"] == len(found.rows) and summary["num_examples"] == len(u)
    assert summary["accuracy"] == pytest.approx(correct.mean())
    assert summary["searched_bins"] == found.searched_bins
    direction = "higher" if u is pmax else "lower"
    assert summary["direction"] == f"{direction} is more confident"


def test_report_of_a_flawless_top_bin_has_no_rows_but_its_bin():
  u = np.arange(40, dtype=np.float32)
  correct = np.arange(40) >= 10
  labels = np.zeros(40, int)
  found = mislabeled.report(u, correct, labels, labels, ("a", "b"), n_bins=4)
  assert found.rows == [] and found.summary()["num_found"] == 0
  assert found.searched_bins == [
    {"bin": 3, "count": 10, "correct": 10, "prob": pytest.approx((10 + 0.75) / 11),
     "score_min": 30.0, "score_max": 39.0}
  ]  # fmt: skip


@pytest.mark.parametrize(
  "change, match",
  [
    ({"predicted": np.array([0, 1, 2, 3])}, r"predicted: labels out of range \[0, 2\)"),
    ({"given": np.array([0, 1, 1])}, "length mismatch"),
    ({"class_names": ("only",)}, r"predicted: labels out of range \[0, 1\)"),
    ({"u": np.array([0.1, np.inf, 0.3, 0.4])}, "u: 1 non-finite"),
    ({"top_bins": 3}, "top_bins: expected at least 1, at most 2"),
  ],
)
def test_report_names_a_bad_argument(change, match):
  args = {
    "u": np.array([0.1, 0.2, 0.3, 0.4]),
    "correct": np.array([1, 0, 1, 1], bool),
    "predicted": np.array([0, 1, 0, 0]),
    "given": np.array([0, 0, 0, 1]),
    "class_names": ("a", "b"),
    "top_bins": 1,
  }
  args.update(change)
  with pytest.raises(ValueError, match=match):
    mislabeled.report(**args, n_bins=2)
