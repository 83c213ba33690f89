"""Selective prediction with a guarantee: the bound holds in repeated draws, the
binary search against SciPy's Clopper–Pearson, and the selection applied to new scores."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from top1_jax.core import binning
from top1_jax.evaluation import crossval, selective


def _accuracy(u):
  """P(correct | U = u) of the synthetic classifier, u ~ Uniform(0, 1)."""
  return 1 - 0.1 * u**2


def _accuracy_integral(u):
  return u - 0.1 * u**3 / 3


def _true_accuracy(selection):
  """Accuracy of the selected region of U ~ Uniform(0, 1), exactly (the held-out limit)."""
  edges = np.concatenate([[0.0], np.minimum(np.asarray(selection.edges, np.float64), 1.0), [1.0]])
  selected = np.asarray(selection.selected)
  low, high = edges[:-1][selected], edges[1:][selected]
  return np.sum(_accuracy_integral(high) - _accuracy_integral(low)) / np.sum(high - low)


def _draw(rng, num):
  u = rng.random(num).astype(np.float32)
  return u, rng.random(num) < _accuracy(u)


def test_guaranteed_accuracy_holds_in_repeated_draws():
  # Accuracy 0.99 is reached by U <= 0.548 (54.8% coverage); 200 calibration sets.
  target, delta, repeats = 0.99, 0.05, 200
  rng = np.random.default_rng(0)
  failures, coverage = 0, []
  for _ in range(repeats):
    selection = selective.guaranteed_coverage(binning.fit(*_draw(rng, 5000), 20), target, delta)
    if bool(jnp.any(selection.selected)):
      coverage.append(float(selection.coverage))
      failures += _true_accuracy(selection) < target
      assert float(selection.guaranteed_accuracy) >= target
  # 3 binomial standard deviations of slack above delta.
  assert failures / repeats <= delta + 3 * math.sqrt(delta * (1 - delta) / repeats)
  assert len(coverage) > 0.9 * repeats and 0.25 < np.mean(coverage) < 0.548


def test_held_out_accuracy_of_the_selection_reaches_the_target():
  rng = np.random.default_rng(1)
  selection = selective.guaranteed_coverage(binning.fit(*_draw(rng, 20000), 20), 0.99, 0.05)
  u, correct = _draw(rng, 400_000)
  answered = np.asarray(selective.select(selection, u))
  assert np.mean(answered) == pytest.approx(float(selection.coverage), abs=0.01)
  assert np.mean(correct[answered]) >= 0.99


def test_ranking_bins_by_their_own_accuracy_voids_the_bound():
  """Flat true accuracy 0.988 < 0.99: every non-empty selection is a failure. Ranked
  by the score, the bound selects nothing; ranked by the bins' calibrated P(correct)
  (their own hits), the luckiest bins pass (documented in guaranteed_coverage)."""
  rng = np.random.default_rng(2)
  chosen = {"ascending": 0, "prob": 0}
  for _ in range(20):
    u = rng.random(20000).astype(np.float32)
    bins = binning.fit(u, rng.random(20000) < 0.988, 100)
    for order in chosen:
      selection = selective.guaranteed_coverage(bins, 0.99, 0.05, order=order)
      chosen[order] += bool(jnp.any(selection.selected))
  assert chosen["ascending"] <= 2 and chosen["prob"] >= 18


def _bins(counts, hits, prob=None):
  counts, hits = np.asarray(counts, np.int32), np.asarray(hits, np.int32)
  prior = hits.sum() / counts.sum()
  prob = binning.calibrated_prob(hits, counts, prior) if prob is None else np.asarray(prob)
  edges = np.arange(1, counts.shape[0], dtype=np.float32)
  return binning.Bins(*map(jnp.asarray, (edges, counts, hits, prob, prior, np.sum(counts > 0))))


def _one_sided_lower(hits, counts, level):
  return 0.0 if hits == 0 else stats.beta.ppf(level, hits, counts - hits + 1)


@pytest.mark.parametrize("target", [0.0, 0.95, 0.99, 0.995, 0.998])
def test_binary_search_finds_the_largest_passing_prefix(target):
  counts = np.full(8, 1000)
  hits = np.array([1000, 999, 998, 995, 990, 980, 950, 900])
  selection = selective.guaranteed_coverage(_bins(counts, hits), target, 0.05)
  tests = math.ceil(math.log2(8 + 1))  # 4
  lower = [_one_sided_lower(hits[:j].sum(), counts[:j].sum(), 0.05 / tests) for j in range(1, 9)]
  size = max([0] + [j for j in range(1, 9) if lower[j - 1] >= target])  # lower is decreasing
  assert int(selection.num_tests) == tests
  np.testing.assert_array_equal(selection.selected, np.arange(8) < size)
  assert float(selection.coverage) == pytest.approx(size / 8)
  if size:
    assert float(selection.guaranteed_accuracy) == pytest.approx(lower[size - 1], abs=2e-5)
    assert float(selection.accuracy) == pytest.approx(hits[:size].sum() / counts[:size].sum())


def test_orders_rank_the_bins_as_documented():
  counts = np.full(4, 1000)
  hits = np.array([900, 990, 1000, 1000])
  prob = np.array([0.9, 0.99, 0.999, 0.998])
  bins = _bins(counts, hits, prob)
  by_prob = selective.guaranteed_coverage(bins, 0.99, 0.05, order="prob")
  np.testing.assert_array_equal(by_prob.selected, [False, True, True, True])
  assert float(by_prob.threshold) == pytest.approx(0.99)
  descending = selective.guaranteed_coverage(bins, 0.99, 0.05, order="descending")
  np.testing.assert_array_equal(descending.selected, [False, True, True, True])
  ascending = selective.guaranteed_coverage(bins, 0.99, 0.05)
  assert not bool(jnp.any(ascending.selected))  # bin 0 alone is 90% accurate


def test_unreachable_target_selects_nothing_and_leaves_its_accuracy_undefined():
  rng = np.random.default_rng(3)
  u, correct = _draw(rng, 5000)
  bins = binning.fit(u, correct, 20)
  selection = selective.guaranteed_coverage(bins, 0.9999, 0.05)
  assert not bool(jnp.any(selection.selected))
  assert float(selection.coverage) == 0.0 and float(selection.threshold) == np.inf
  assert np.isnan(float(selection.accuracy)) and np.isnan(float(selection.guaranteed_accuracy))
  assert not bool(jnp.any(selective.select(selection, u)))
  splits = crossval.make_splits(5000, 2)
  (row,) = selective.validate_over_splits(u, correct, splits, 20, targets=(0.9999,))
  assert row["num_empty"] == 2 and row["test_coverage"] == 0.0
  assert row["test_accuracy"] is None and row["guaranteed_accuracy"] is None


@pytest.mark.parametrize("target", [1.0, 1.5, -0.1, float("nan"), "a"])
def test_a_target_of_one_or_outside_zero_one_is_refused(target):
  # No finite calibration set guarantees 1: a lower confidence bound is below 1 even
  # with every example correct (past ~1.3e8 of them the float32 bound rounded to 1).
  bins = binning.fit(np.arange(10.0), np.ones(10, bool), 2)
  with pytest.raises(ValueError, match=r"^target_accuracy: expected an accuracy in \[0, 1\)"):
    selective.guaranteed_coverage(bins, target)
  splits = crossval.make_splits(10, 2)
  with pytest.raises(ValueError, match=r"^targets: expected an accuracy in \[0, 1\)"):
    selective.validate_over_splits(
      np.arange(10.0), np.ones(10, bool), splits, 2, targets=(0.9, target)
    )


def test_select_answers_the_calibration_examples_counted_as_covered():
  rng = np.random.default_rng(4)
  u, correct = _draw(rng, 3000)
  bins = binning.fit(u, correct, 30)
  selection = selective.guaranteed_coverage(bins, 0.98, 0.1)
  answered = np.asarray(selective.select(selection, u))
  assert answered.mean() == pytest.approx(float(selection.coverage), abs=1e-6)
  assert correct[answered].mean() == pytest.approx(float(selection.accuracy), abs=1e-6)


def _loop_cross_validate(u, correct, splits, n_bins, targets, delta, order):
  """Split by split, target by target, with the public calls only."""
  rows = []
  for target in targets:
    per_split = []
    for f in range(splits.num_splits):
      test = np.asarray(splits.test_mask(f))
      bins = binning.fit(u[~test], correct[~test], n_bins)
      selection = selective.guaranteed_coverage(bins, target, delta, order=order)
      chosen = np.asarray(selective.select(selection, u[test]))
      bound = float(selection.guaranteed_accuracy)
      per_split.append(
        {
          "guaranteed_accuracy": bound if np.isfinite(bound) else None,
          "calibration_coverage": float(selection.coverage),
          "test_coverage": chosen.sum() / chosen.shape[0],
          "test_accuracy": float(correct[test][chosen].mean()) if chosen.any() else None,
        }
      )
    means = {}
    for key in per_split[0]:
      values = [p[key] for p in per_split if p[key] is not None]
      means[key] = float(np.mean(values)) if values else None
    below = [p["test_accuracy"] is not None and p["test_accuracy"] < target for p in per_split]
    empty = [p["guaranteed_accuracy"] is None for p in per_split]
    rows.append(
      {
        "order": order,
        **means,
        "num_splits": splits.num_splits,
        "num_empty": sum(empty),
        "target_accuracy": target,
        "delta": delta,
        "n_bins": n_bins,
        "num_below_target": sum(below),
        "per_split": per_split,
      }
    )
  return rows


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_cross_validate_matches_a_split_by_split_loop(order):
  u, correct = _draw(np.random.default_rng(5), 3000)
  u = u if order == "ascending" else 1 - u  # high = confident
  splits = crossval.make_splits(3000, 4, seed=0)
  targets = (0.95, 0.9, 0.9999)
  rows = selective.validate_over_splits(u, correct, splits, 10, targets, 0.05, order=order)
  expected = _loop_cross_validate(u, correct, splits, 10, targets, 0.05, order)
  assert rows == expected
  assert [r["target_accuracy"] for r in rows] == list(targets)
  assert rows[0]["num_empty"] < 4 and rows[1]["num_empty"] == 0 and rows[2]["num_empty"] == 4
  assert rows[1]["test_accuracy"] > 0.9 and list(rows[0]) == list(expected[0])


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda b: selective.guaranteed_coverage(b, 1.5), "target_accuracy: expected an accuracy in"),
    (lambda b: selective.guaranteed_coverage(b, 0.9, 0.5), "delta: expected a probability in"),
    (lambda b: selective.guaranteed_coverage(b, 0.9, order="x"), "order: expected one of"),
    (lambda b: selective.guaranteed_coverage("bins"), "bins: expected binning.Bins"),
    (lambda b: selective.select(b, [0.1]), "selection: expected selective.Selection"),
    (
      lambda b: selective.select(selective.guaranteed_coverage(b), [np.inf]),
      "u: 1 non-finite",
    ),
    (
      lambda b: selective.validate_over_splits(
        np.ones(50), np.ones(50), crossval.make_splits(40, 2), 5
      ),
      "splits: made for 40 examples, u has 50",
    ),
    (
      lambda b: selective.validate_over_splits(np.ones(50), np.ones(50), "halves", 5),
      "splits: expected crossval.Splits",
    ),
    (
      lambda b: selective.validate_over_splits(
        np.ones(50), np.ones(50), crossval.make_splits(50, 2), 5, targets=(0.9, 1.2)
      ),
      "targets: expected an accuracy in",
    ),
    (
      lambda b: selective.validate_over_splits(
        np.ones(50), np.ones(50), crossval.make_splits(50, 2), 5, order="x"
      ),
      "order: expected one of",
    ),
  ],
)
def test_bad_input_gets_a_one_line_value_error(call, message):
  bins = binning.fit(np.linspace(0, 1, 50), np.ones(50, bool), 5)
  with pytest.raises(ValueError, match=message) as info:
    call(bins)
  assert "\n" not in str(info.value)
